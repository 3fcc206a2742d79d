"""CPU a rank's process spends (all its threads: gloo's included) on an all-reduce alone, at 1 and 8 MiB; run on
the emulated cluster: tessel cluster run --hosts 8 --rate 1gbit --torchrun -- bench/plan-ddp-8h-1g/probe_cpu.py"""
import statistics
import time

import torch
import torch.distributed as dist

from tessel import comm


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for _ in range(3):
        comm.all_reduce(torch.zeros(1), "probe")
    out = []
    for mib in (1, 8):
        t = torch.zeros(mib * 2**20 // 4)
        walls, cpus = [], []
        for _ in range(6):
            comm.barrier("probe")
            w0, c0 = time.perf_counter(), time.process_time()
            comm.all_reduce(t, "probe")
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        out += [statistics.median(walls), statistics.median(cpus)]
    mine = torch.tensor(out, dtype=torch.float64)
    st = torch.stack(comm.all_gather(mine, "probe"))
    if dist.get_rank() == 0:
        w1, c1, w8, c8 = (float(x) * 1e3 for x in st.median(0).values)
        print(f"all-reduce alone, medians over 8 ranks of 6 tries: 1 MiB wall {w1:.1f} ms, process CPU {c1:.1f} ms; "
              f"8 MiB wall {w8:.1f} ms, process CPU {c8:.1f} ms")
    dist.destroy_process_group()


main()
