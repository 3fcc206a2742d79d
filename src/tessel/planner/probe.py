"""What a rank's link and CPU give under load, measured on the job's own hosts: the planner's topology.

Run as a torchrun worker on every host (``tessel bench plan`` does, per cell)::

    tessel cluster run --hosts 4 --rate 200mbit --torchrun -- -m tessel.planner.probe

Rank 0 prints one JSON line: ``latency`` (seconds per ring step of a tiny all-reduce issued between
compute bursts, as the training step issues its collectives: on a host under a CPU quota a collective can
wait for a throttled peer, which an idle probe never sees), ``speed`` (thread CPU time over wall time of
the compute bursts alone: the share of a core a rank gets) and ``idle_latency``.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.distributed as dist


def _burst(a: torch.Tensor, w: torch.Tensor, n: int) -> None:
    for _ in range(n):
        a @ w


def measure(rounds: int = 40, burst: int = 6) -> dict:
    n = dist.get_world_size()
    steps = max(2 * (n - 1), 1)
    one = torch.zeros(1)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    for _ in range(5):
        dist.all_reduce(one)
    idle = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        dist.all_reduce(one)
        idle.append(time.perf_counter() - t0)
    wall, cpu = [], []
    for _ in range(rounds):  # compute alone: the speed a rank gets
        t0, c0 = time.perf_counter(), time.thread_time()
        _burst(a, w, burst)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    dist.barrier()
    loaded = []
    for _ in range(rounds):  # compute, then a collective, as a step does
        _burst(a, w, burst)
        t0 = time.perf_counter()
        dist.all_reduce(one)
        loaded.append(time.perf_counter() - t0)
    mine = torch.tensor([statistics.mean(loaded) / steps, sum(cpu) / sum(wall), statistics.median(idle) / steps],
                        dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(n)]
    dist.all_gather(every, mine)
    stack = torch.stack(every)
    return {"latency": float(stack[:, 0].max()), "speed": float(stack[:, 1].min()),
            "idle_latency": float(stack[:, 2].max()), "ranks": n}


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out = measure()
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
