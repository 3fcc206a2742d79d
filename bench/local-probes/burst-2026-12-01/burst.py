"""On emulated hosts under a CPU quota: the wall time of a compute burst over its CPU time, when the host bursts
alone (the other hosts wait, as in a pipeline's bubble) and when every host bursts at once (as the probe measures
speed). The burst: forward and backward of a 1024 x 1024 linear on 64 rows (a layer of the planner cells'
classifier), repeated n times. Run on every host:

    tessel cluster run --hosts 3 --rate 300mbit --torchrun -- bench/local-probes/burst-2026-12-01/burst.py 8
"""
import statistics, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.set_num_threads(1)
me, world = dist.get_rank(), dist.get_world_size()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
lin = torch.nn.Linear(1024, 1024)
x = torch.randn(64, 1024, requires_grad=True)

def burst(n):
    for _ in range(n):
        lin(x).sum().backward()

burst(20)
out = {}
for n in (1, 4, 16):
    alone, together = [], []
    for r in range(rounds):
        for turn in range(world):  # alone: one host at a time, the others wait at the barrier
            dist.barrier()
            if turn == me:
                time.sleep(0.05)  # an idle spell before the burst, as a stage has in a bubble
                t0, c0 = time.perf_counter(), time.thread_time()
                burst(n)
                alone.append((time.perf_counter() - t0) / (time.thread_time() - c0))
        dist.barrier()
        time.sleep(0.05)
        t0, c0 = time.perf_counter(), time.thread_time()
        burst(n)  # together: every host at once
        together.append((time.perf_counter() - t0) / (time.thread_time() - c0))
    cpu = time.thread_time()
    burst(n)
    cpu = time.thread_time() - cpu
    out[n] = (cpu, statistics.median(alone), statistics.median(together))
res = [None] * world
dist.all_gather_object(res, out)
if me == 0:
    for n in out:
        print(f"burst of {n:2d} ({out[n][0]*1e3:5.1f} ms CPU): speed alone " +
              " ".join(f"{1 / r[n][1]:.2f}" for r in res) + " | together " + " ".join(f"{1 / r[n][2]:.2f}" for r in res))
dist.destroy_process_group()
