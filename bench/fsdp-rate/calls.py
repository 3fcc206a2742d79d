"""Why FSDP's calls on 2 whole-core hosts at 100 Mbit/s ran at about two thirds of the probe's rate
(bench/plan-head/where/): the probe's FSDP pair calls one at a time after a barrier; FSDP calls back to back. Each
rank times tessel.comm's all-gather and reduce-scatter at 1.72 MB sent a call on 2 ranks (the classifier's step's
average, as bench/plan-head-2h-100 counted 17,203,600 B in 10 gathers, two of them small; its hidden layers' calls
are about 2.1 MB), RUNS calls a way:
  barrier   each call after a barrier (as planner.probe.fsdp_rates, less its compute burst)
  chain     calls back to back, all-gathers only
  fsdp      back to back in FSDP's order: 5 gathers, then 5 (gather, reduce-scatter) pairs, as a recomputed step
  burst     each call after MS ms of compute, no barrier (as in the job: 1-9 ms between calls)
and the host's TCP counters that moved in each way. The slowest rank's median Mbit/s a way is printed as JSON.
On more hosts every consecutive pair calls at once (FSDP over 2 ranks in each of the pipeline's stages).
  tessel cluster run --hosts 2 --rate 100mbit --cpus 1 --torchrun -- bench/fsdp-rate/calls.py > log"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from tessel import comm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plan-latency"))
from tcpstat import tcp_counters  # noqa: E402

SENT = 1_720_360  # bytes a rank sends a call
RUNS = int(os.environ.get("RUNS", "10"))
MS = float(os.environ.get("MS", "5"))


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def main() -> None:
    dist.init_process_group("gloo")
    pair, _ = dist.new_subgroups(2)  # consecutive pairs, all calling at once, as FSDP2's shard groups of 2 do
    p = dist.get_world_size(pair)
    part = torch.zeros(SENT // 4 // (p - 1))  # a rank's shard; it sends (p - 1) shards' worth a gather
    whole = torch.zeros(part.numel() * p)
    gather = lambda: comm.all_gather_into(whole, part, "probe", pair)  # noqa: E731
    scatter = lambda: comm.reduce_scatter(part, whole, "probe", pair)  # noqa: E731
    gather(), scatter()  # (gloo's first call at a size sets up its buffers)
    ways = {"barrier": [], "chain": [], "fsdp": [], "burst": []}
    for way in ways:
        comm.barrier("probe")
        before = tcp_counters()
        order = [gather] * RUNS if way != "fsdp" else [gather] * (RUNS // 2) + [gather, scatter] * (RUNS // 2)
        for call in order:
            if way == "barrier":
                comm.barrier("probe")
            elif way == "burst":
                spin(MS)
            t0 = time.perf_counter()
            call()
            ways[way].append((call is gather, time.perf_counter() - t0))
        moved = {k: v - before.get(k, 0) for k, v in tcp_counters().items() if v != before.get(k, 0)}
        ways[way] = {"gather": [w for g, w in ways[way] if g], "scatter": [w for g, w in ways[way] if not g],
                     "tcp": {k: v for k, v in moved.items() if "Retrans" in k or "Loss" in k or "Timeout" in k}}
    mine = torch.tensor([SENT * 8 / 1e6 / statistics.median(v[c]) if v[c] else 0.0
                         for v in ways.values() for c in ("gather", "scatter")], dtype=torch.float64)
    slowest = torch.stack(comm.all_gather(mine, "probe")).min(0).values.tolist()
    if dist.get_rank() == 0:
        rates = {way: {c: round(slowest[2 * i + k], 1) for k, c in enumerate(("gather", "scatter"))
                       if slowest[2 * i + k] > 0} for i, way in enumerate(ways)}  # (only fsdp has scatters)
        print("rates " + json.dumps({"ms": MS, "runs": RUNS, "mbit": rates,
                                     "tcp": {w: v["tcp"] for w, v in ways.items()}}), flush=True)
    dist.destroy_process_group()


main()
