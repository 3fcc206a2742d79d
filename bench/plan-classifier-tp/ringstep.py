"""Why the probe's ring step came out 1.6-1.8x what calls.py measured for the same 4 KiB all-reduce in the same
minutes: one invocation times the same call four ways, in this order, each 40 calls after a barrier:
  A: as the probe does (right after its compute-burst phases), each call timed alone, the mean;
  B: the same, again, straight after A;
  C: after a barrier and 2 s asleep (a host's CPU quota refilled), each call timed alone;
  D: 40 calls timed together (calls.py's way).
Per rank: the mean and median of a call; printed by rank 0 with the max and median over ranks, per ring step.

Run: tessel cluster run --hosts 8 --rate 1gbit --cpus 0.25 --torchrun -- bench/plan-classifier-tp/ringstep.py"""
import statistics
import time

import torch
import torch.distributed as dist

from tessel import comm
from tessel.planner import probe


def series(t, n=40):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        comm.all_reduce(t, "probe")
        out.append(time.perf_counter() - t0)
    return out


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    n = dist.get_world_size()
    steps = 2 * (n - 1)
    one, small = torch.zeros(1), torch.zeros(probe.SMALL // 4)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    for _ in range(5):
        comm.all_reduce(one, "probe")
    for _ in range(40):  # the probe's speed phase: compute bursts alone
        probe.compute_burst(a, w, 6)
    comm.barrier("probe")
    probe.loaded(one, a, w, 40, 6)  # the probe's tiny phase
    probe.loaded(small, a, w, 3, 0)
    rows = {"A": series(small), "B": series(small)}
    comm.barrier("probe")
    time.sleep(2)
    comm.barrier("probe")
    rows["C"] = series(small)
    comm.barrier("probe")
    t0 = time.perf_counter()
    for _ in range(40):
        comm.all_reduce(small, "probe")
    whole = (time.perf_counter() - t0) / 40
    mine = [v for k in "ABC" for v in (statistics.mean(rows[k]), statistics.median(rows[k]), max(rows[k]))] + [whole]
    got = torch.stack(comm.all_gather(torch.tensor(mine, dtype=torch.float64), "probe")) / steps * 1e3
    if dist.get_rank() == 0:
        for i, k in enumerate("ABC"):
            col = got[:, 3 * i:3 * i + 3]
            print(f"{k}: ms a ring step; mean of a call: max over ranks {col[:, 0].max():.2f}, median "
                  f"{col[:, 0].median():.2f}; median of a call: max {col[:, 1].max():.2f}, median "
                  f"{col[:, 1].median():.2f}; slowest call: median over ranks {col[:, 2].median():.2f}", flush=True)
        print(f"D: 40 timed together: max over ranks {got[:, 9].max():.2f}, median {got[:, 9].median():.2f}",
              flush=True)
    dist.destroy_process_group()


main()
