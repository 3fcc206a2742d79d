"""CPU a gloo send and receive cost on each end: rank 0 sends n tensors of each size to rank 1, which answers each
with one of the same size (as a pipeline stage's activation and its gradient); CPU seconds of the main thread and
of the whole process per message pair, and wall."""
import os, time, statistics, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank(); torch.set_num_threads(1)
def cpu(): return time.thread_time(), time.process_time(), time.perf_counter()
for size in (4 << 10, 64 << 10, 1 << 20):
    t = torch.zeros(size // 4); out = torch.empty_like(t)
    n = 400 if size < (1 << 20) else 100
    for rep in range(2):
        dist.barrier(); a = cpu()
        for i in range(n):
            if r == 0:
                dist.isend(t, 1).wait(); dist.irecv(out, 1).wait()
            else:
                dist.irecv(out, 0).wait(); dist.isend(t, 0).wait()
        b = cpu()
        if rep == 1:
            d = [(y - x) / n * 1e3 for x, y in zip(a, b)]
            print(f"rank {r} {size >> 10:5d} KiB: per send+recv main {d[0]:.3f} ms, process {d[1]:.3f} ms, wall {d[2]:.3f} ms", flush=True)
dist.destroy_process_group()
