"""What an all-reduce costs right after compute, against back to back: the world's group, each size after a burst of
matmuls of about 0, 1, 3 and 6 ms of a core's CPU, 20 times, the call's wall alone (the compute excluded) and the
burst's wall, medians over calls, then the median and the range over ranks; also each rank's mean over calls (the median
over ranks) and the longest call on any rank. A tensor-parallel layer's call follows
its layer's compute like this; the planner's probe times its calls back to back.

Run: tessel cluster run --hosts 4 --rate 1gbit --cpus 0.5 --torchrun -- bench/plan-tf-tp4-4h/after.py"""
import statistics
import time

import torch
import torch.distributed as dist

SIZES = (1024, 65536, 131072, 262144)  # fp32 elements: 4 KiB to 1 MiB (a Transformer tp call here is 512 KiB)
BURSTS = (0.0, 1e-3, 3e-3, 6e-3)  # seconds of a core's CPU before each call


def burner(seconds: float):
    """A function that spends about ``seconds`` of the main thread's CPU on 64x64 matmuls (calibrated here)."""
    a = torch.randn(64, 64)
    t0 = time.thread_time()
    for _ in range(200):
        a @ a
    each = (time.thread_time() - t0) / 200
    n = round(seconds / each)
    return lambda: [a @ a for _ in range(n)]


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for seconds in BURSTS:
        burn = burner(seconds)
        for n in SIZES:
            t = torch.zeros(n)
            for _ in range(3):
                dist.all_reduce(t)
            dist.barrier()
            calls, bursts, cpu = [], [], []
            for _ in range(20):
                b0, c0 = time.perf_counter(), time.thread_time()
                burn()
                b1, c1 = time.perf_counter(), time.thread_time()
                dist.all_reduce(t)
                calls.append(time.perf_counter() - b1)
                bursts.append(b1 - b0)
                cpu.append(c1 - c0)
            rows.append((seconds, n, statistics.median(calls), statistics.median(bursts), statistics.median(cpu),
                         statistics.mean(calls), max(calls)))
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        for i, (seconds, n, *_) in enumerate(rows):
            call = sorted(r[i][2] for r in gathered)
            burst = statistics.median(r[i][3] for r in gathered)
            cpu = statistics.median(r[i][4] for r in gathered)
            print(f"burst {seconds * 1e3:.0f} ms CPU (measured {cpu * 1e3:.2f} CPU, {burst * 1e3:.2f} wall), "
                  f"{n * 4 // 1024} KiB: call wall median over ranks {statistics.median(call) * 1e3:.2f} ms, "
                  f"ranks {call[0] * 1e3:.2f}-{call[-1] * 1e3:.2f}; "
                  f"mean over calls {statistics.median(r[i][5] for r in gathered) * 1e3:.2f}, "
                  f"longest {max(r[i][6] for r in gathered) * 1e3:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
