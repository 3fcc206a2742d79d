"""Is a loaded collective's wait per ring step or per call? The planner's probe times a tiny all-reduce issued after
a compute burst on the whole world and prices the time per ring step (2(n-1) of them); a tensor-parallel plan's
collectives run in groups of 2 or 4. Here the same loaded tiny all-reduce (tessel.planner.probe.loaded) in groups of
2, 4 and 8 ranks (consecutive ranks, as tp groups are), idle too, after bursts of 1 and 6 matmuls (about 3 and 16 ms of a quarter core), 40 calls each, medians per call over the calls,
then the median over ranks; and a send and a receive between neighbouring ranks, idle and after a burst. Run: tessel cluster run --hosts 8 --rate 1gbit --torchrun -- bench/plan-ddp-8h-1g/stall.py"""
import statistics
import time

import torch
import torch.distributed as dist

from tessel.planner.probe import compute_burst

ROUNDS, BURSTS = 40, (1, 6)  # matmuls of 64x512 @ 512x512 before each call (the probe's: 6)


def timed(t, group, a, w, burst):
    out = []
    for _ in range(ROUNDS):
        if burst:
            compute_burst(a, w, burst)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def pair(t, a, w, burst, rank):
    """Seconds of a send to the neighbour and the receive of its send (one activation forward, its gradient back,
    as a pipeline stage's pair), each after a compute burst."""
    peer = rank ^ 1
    out = []
    for _ in range(ROUNDS):
        if burst:
            compute_burst(a, w, burst)
        t0 = time.perf_counter()
        if rank % 2 == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    one, a, w = torch.zeros(1), torch.randn(64, 512), torch.randn(512, 512)
    row = []
    for size in (2, 4, 8):
        groups = [dist.new_group(list(range(s, s + size))) for s in range(0, world, size)]
        mine = groups[rank // size]
        for _ in range(5):
            dist.all_reduce(one, group=mine)
        dist.barrier()
        row += [timed(one, mine, a, w, 0), *(timed(one, mine, a, w, b) for b in BURSTS)]
    dist.barrier()
    row += [pair(one, a, w, 0, rank), *(pair(one, a, w, b, rank) for b in BURSTS)]
    got = [torch.zeros(len(row), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(got, torch.tensor(row, dtype=torch.float64))
    if rank == 0:
        med = torch.stack(got).median(0).values * 1e3
        k = 1 + len(BURSTS)
        for i, size in enumerate((2, 4, 8)):
            idle, *loaded = (med[k * i + j].item() for j in range(k))
            steps = 2 * (size - 1)
            print(f"group of {size} ({steps} ring steps): idle {idle:.2f} ms a call; after a burst of "
                  + ", of ".join(f"{b} matmuls {t:.2f} ms a call ({t / steps:.2f} a ring step)"
                                 for b, t in zip(BURSTS, loaded)))
        idle, *loaded = (med[3 * k + j].item() for j in range(k))
        print(f"a send and a receive between neighbours: idle {idle:.2f} ms; after a burst of "
              + ", of ".join(f"{b} matmuls {t:.2f} ms" for b, t in zip(BURSTS, loaded)))
    dist.destroy_process_group()


main()
