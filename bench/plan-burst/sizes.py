"""A message's crossing after the link idled, by size: what the estimate prices a pipeline's first crossing at
(its bytes beyond the probe's link_burst over the rate, plus a one-element message's time) against what it takes.
The first and last ranks exchange, after 50 ms of quiet, a message of each size and a one-element answer
(tessel.planner.probe.link_burst's exchange), ROUNDS rounds; then the probe's own link_burst in the same invocation.
Rank 0 prints one JSON line: per size the median seconds and the priced seconds.
  tessel cluster run --hosts 3 --rate 300mbit --cpus 0.667 --torchrun -- bench/plan-burst/sizes.py"""
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from tessel import comm
from tessel.planner import probe

SIZES = (16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20)
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def crossing(n: int, peer: int | None, msg: torch.Tensor, ack: torch.Tensor) -> float:
    comm.barrier("probe")
    time.sleep(probe.IDLE)
    t0 = time.perf_counter()
    if dist.get_rank() == 0:
        comm.send(msg, peer, "probe")
        comm.recv(ack, peer, "probe")
    elif dist.get_rank() == n - 1:
        comm.recv(msg, peer, "probe")
        comm.send(ack, peer, "probe")
    return time.perf_counter() - t0


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    n, rank = dist.get_world_size(), dist.get_rank()
    peer, ack = {0: n - 1, n - 1: 0}.get(rank), torch.zeros(1)
    mbit = float(os.environ["RATE_MBIT"])
    walls = {s: [] for s in (4, *SIZES)}
    for _ in range(ROUNDS):
        for s in walls:
            walls[s].append(crossing(n, peer, torch.zeros(s // 4), ack))
    burst = probe.link_burst(mbit)
    if rank == 0:
        tiny = statistics.median(walls[4])
        out = {s: {"measured_ms": round(statistics.median(w) * 1e3, 2),
                   "priced_ms": round((max(0.0, s - burst) * 8 / (mbit * 1e6) + tiny) * 1e3, 2),
                   "at_rate_ms": round((s * 8 / (mbit * 1e6) + tiny) * 1e3, 2)} for s, w in walls.items()}
        print("sizes " + json.dumps({"hosts": n, "mbit": mbit, "link_burst": round(burst), "crossing": out}),
              flush=True)
    dist.destroy_process_group()


main()
