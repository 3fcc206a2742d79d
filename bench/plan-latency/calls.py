"""What one all-reduce costs by its size on the emulated hosts: groups of 2, 4 and 8 consecutive ranks (as many as the
world holds), each size 20 times back to back after a barrier, wall and CPU per call (the process's: gloo's threads and
the kernel's network work too; the main thread's), medians over ranks. `up` runs the sizes small to large, `down` large
to small (an order effect would show between the two), `elements` the sizes of 1 to 1024 elements.

Run: tessel cluster run --hosts 8 --rate 1gbit --torchrun -- bench/plan-latency/calls.py up"""
import sys
import time

import torch
import torch.distributed as dist

KIB = (1, 1024, 4096, 16384, 65536, 262144, 1048576)  # fp32 elements: 4 B to 4 MiB
SIZES = {"up": KIB, "down": tuple(reversed(KIB)), "elements": (1, 2, 8, 64, 1024)}[sys.argv[1]]


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [s for s in (2, 4, 8) if s <= world]
    row = []
    for size in groups:
        group, _ = dist.new_subgroups_by_enumeration([list(range(s, s + size)) for s in range(0, world, size)])
        for n in SIZES:
            t = torch.zeros(n)
            for _ in range(3):
                dist.all_reduce(t, group=group)
            dist.barrier()
            w0, p0, c0 = time.perf_counter(), time.process_time(), time.thread_time()
            for _ in range(20):
                dist.all_reduce(t, group=group)
            row += [(time.perf_counter() - w0) / 20, (time.process_time() - p0) / 20, (time.thread_time() - c0) / 20]
    got = [torch.zeros(len(row), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(got, torch.tensor(row, dtype=torch.float64))
    if rank == 0:
        med, i = torch.stack(got).median(0).values * 1e3, 0
        for size in groups:
            for n in sorted(SIZES):
                j = i + 3 * SIZES.index(n)
                what = f"{n} elements" if sys.argv[1] == "elements" else f"{n * 4 // 1024} KiB"
                print(f"group {size} {what}: wall {med[j]:.2f} ms, process CPU {med[j + 1]:.3f}, main thread "
                      f"{med[j + 2]:.3f} a call", flush=True)
            i += 3 * len(SIZES)
    dist.destroy_process_group()


main()
