"""The rate each of tessel.comm's collectives moves its bytes at on the emulated hosts, beside the all-reduce the
planner's probe measures: all-reduce, all-gather (FSDP's gather), reduce-scatter (tessel.comm's: an all-to-all
and a local sum, FSDP's reduce-scatter) and the all-to-all itself, at 256 KiB, 1 MiB and 4 MiB, each issued after
the probe's compute burst, median of 6. Prints, per collective and size, every rank's (ms, Mbit/s of the bytes
tessel.comm counts for it).

    tessel cluster run --hosts 4 --rate 200mbit --torchrun -- bench/plan/collective_rates.py
"""

import statistics
import time
from functools import partial

import torch
import torch.distributed as dist

from tessel import comm
from tessel.planner.probe import compute_burst


def rates(p: int) -> dict:
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    out = {}
    for nbytes in (256 << 10, 1 << 20, 4 << 20):
        n = nbytes // 4
        t, part, whole = torch.zeros(n), torch.zeros(n // p), torch.zeros(n)
        ops = {"all_reduce": (partial(comm.all_reduce, t, "rates"), 2 * (p - 1) / p * nbytes),
               "all_gather": (partial(comm.all_gather_into, whole, part, "rates"), (p - 1) / p * nbytes),
               "reduce_scatter": (partial(comm.reduce_scatter, part, t, "rates"), (p - 1) / p * nbytes),
               "all_to_all": (partial(comm.all_to_all, whole, t, "rates"), (p - 1) / p * nbytes)}
        for name, (call, moved) in ops.items():
            call(), call()
            times = []
            for _ in range(6):
                compute_burst(a, w, 6)
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            out[f"{name}@{nbytes >> 10}K"] = (round(med * 1e3, 2), round(moved * 8 / 1e6 / med, 1))
    return out


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mine = rates(dist.get_world_size())
    every = comm.all_gather_object(mine, "rates")
    if dist.get_rank() == 0:
        for k in mine:
            print(k, [r[k] for r in every], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
