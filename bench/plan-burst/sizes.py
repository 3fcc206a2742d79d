"""A message's crossing after the link idled, by size: what the estimate prices a pipeline's first crossing at
(its bytes beyond the probe's link_burst over the rate, plus a one-element message's time) against what it takes.
The first and last ranks exchange, after 50 ms of quiet, a message of each size and a one-element answer
(tessel.planner.probe.crossing, link_burst's exchange), ROUNDS rounds; then the probe's own link_burst in the same
invocation.
Rank 0 prints one JSON line: per size the median seconds and the priced seconds.
  tessel cluster run --hosts 3 --rate 300mbit --cpus 0.667 --torchrun -- bench/plan-burst/sizes.py"""
import json
import os
import statistics

import torch
import torch.distributed as dist

from tessel.planner import probe

SIZES = (16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20)
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, ack = dist.get_rank(), torch.zeros(1)
    mbit = float(os.environ["RATE_MBIT"])
    walls = {s: [] for s in (4, *SIZES)}
    for _ in range(ROUNDS):
        for s in walls:
            walls[s].append(probe.crossing(torch.zeros(s // 4), ack))
    burst = probe.link_burst(mbit)
    if rank == 0:
        tiny = statistics.median(walls[4])
        out = {s: {"measured_ms": round(statistics.median(w) * 1e3, 2),
                   "priced_ms": round((max(0.0, s - burst) * 8 / (mbit * 1e6) + tiny) * 1e3, 2),
                   "at_rate_ms": round((s * 8 / (mbit * 1e6) + tiny) * 1e3, 2)} for s, w in walls.items()}
        line = {"hosts": dist.get_world_size(), "mbit": mbit, "link_burst": round(burst), "crossing": out}
        print("sizes " + json.dumps(line), flush=True)
    dist.destroy_process_group()


main()
