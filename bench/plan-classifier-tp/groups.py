"""The same 4 KiB all-reduce over all 8 ranks, 40 calls timed together after a barrier, on the default group and on
a new group of the same ranks, by torch.distributed directly and through tessel.comm, in alternating order, 3 rounds.
Printed by rank 0: ms a ring step, the median over ranks, per way and round.

Run: tessel cluster run --hosts 8 --rate 1gbit --cpus 0.25 --torchrun -- bench/plan-classifier-tp/groups.py"""
import time

import torch
import torch.distributed as dist

from tessel import comm


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    n = dist.get_world_size()
    fresh = dist.new_group(list(range(n)))
    t = torch.zeros(1024)
    ways = {"default, dist": lambda: dist.all_reduce(t), "new group, dist": lambda: dist.all_reduce(t, group=fresh),
            "default, comm": lambda: comm.all_reduce(t, "probe"),
            "new group, comm": lambda: comm.all_reduce(t, "probe", group=fresh)}
    for f in ways.values():
        for _ in range(3):
            f()
    rows = []
    for _ in range(3):
        for f in ways.values():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(40):
                f()
            rows.append((time.perf_counter() - t0) / 40 / (2 * (n - 1)) * 1e3)
    got = torch.stack(comm.all_gather(torch.tensor(rows, dtype=torch.float64), "probe")).median(0).values
    if dist.get_rank() == 0:
        for i, name in enumerate(ways):
            print(f"{name}: " + ", ".join(f"{got[r * len(ways) + i]:.2f}" for r in range(3)) + " ms a ring step",
                  flush=True)
    dist.destroy_process_group()


main()
