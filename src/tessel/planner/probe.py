"""What a rank's link and CPU give under load, measured on the job's own hosts: the planner's topology.

Run as a torchrun worker on every host (``tessel bench plan`` does, per cell)::

    tessel cluster run --hosts 4 --rate 200mbit --torchrun -- -m tessel.planner.probe

Rank 0 prints one JSON line: ``latency`` (seconds per ring step of a 4 KiB all-reduce, back to back: under a CPU
quota gloo's work for each step is slow, 0.2-0.35 ms of a core on the emulated hosts), ``tiny_latency`` (of a
one-element all-reduce, which gloo reduces by a cheaper path: a loss's, a norm's, issued between compute bursts, as
the training step issues its collectives: on a host under a CPU quota a collective can wait for a throttled peer,
which an idle probe never sees; before 2026-12-07 this was ``latency``, and every call was priced at it), ``speed``
(thread CPU time over wall time of the compute bursts alone: the share of a core a rank gets), ``mbit`` (the rate a
rank moves an 8 MB all-reduce at between bursts: with a CPU quota gloo's copies and sums can fill a fast link only
partly; its ring steps' latency goes on while the bytes travel, Topology.call_seconds), ``overlap`` (how much of
that all-reduce, issued asynchronously, hides behind as long a compute burst: 1 when the two overlap fully, 0 when
they take turns, as gloo's threads and the compute do under a tight CPU quota) and ``idle_latency``.

Everything is timed with a data-parallel job's mesh built and held (:func:`hold_job_mesh`), as a job's process
holds its mesh's groups while it trains.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.distributed as dist

from .. import comm, mesh

# bytes of the all-reduce whose ring steps price a call's latency: 4 KiB to 256 KiB took the same time on the emulated
# hosts, one element a quarter to a tenth of it (bench/plan-latency/calls.txt)
SMALL = 4096


_held: list = []  # the mesh hold_job_mesh built in this process (one at most)


def hold_job_mesh(timeout: float = 30.0):
    """The mesh a data-parallel job builds over the world, built once per process and held from then on.

    A job's process holds its mesh's gloo groups (each with its own threads) while it trains. On the emulated hosts
    a 4 KiB all-reduce over the world took 1.2-1.6x as long per ring step in a process holding only the world's group
    as in one that had built such a mesh, which the call never used: 2.8 against 1.7 ms on 8 hosts of a quarter core,
    1.7 against 1.0 ms on 4 of half a core (bench/plan-probe-groups/probes.jsonl). Why is not established. The probe
    times what a job's calls see."""
    n = dist.get_world_size()
    if not _held:
        _held.append(mesh.build_mesh(mesh.ParallelDims(dp=n, pp=1, tp=1, world_size=n), timeout))
    return _held[0]


def compute_burst(a: torch.Tensor, w: torch.Tensor, n: int) -> None:
    """``n`` matmuls of ``a`` by ``w``: compute such as a step issues between its collectives."""
    for _ in range(n):
        a @ w


def loaded(t: torch.Tensor, a: torch.Tensor, w: torch.Tensor, rounds: int, burst: int) -> list[float]:
    """Seconds of each all-reduce of ``t`` issued after a compute burst, as a step issues its collectives."""
    out = []
    for _ in range(rounds):
        compute_burst(a, w, burst)
        t0 = time.perf_counter()
        comm.all_reduce(t, "probe")
        out.append(time.perf_counter() - t0)
    return out


def hidden_share(t: torch.Tensor, a: torch.Tensor, w: torch.Tensor, alone: float, rounds: int) -> float:
    """Share of an all-reduce taking ``alone`` seconds that hides behind a compute burst of about that length."""
    t0 = time.perf_counter()
    compute_burst(a, w, 4)
    n = max(1, round(4 * alone / (time.perf_counter() - t0)))  # bursts that last as long as the all-reduce
    compute, both = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        compute_burst(a, w, n)
        compute.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        work = comm.all_reduce(t, "probe", async_op=True)
        compute_burst(a, w, n)
        work.wait()
        both.append(time.perf_counter() - t0)
    c, b = statistics.median(compute), statistics.median(both)
    return min(1.0, max(0.0, (c + alone - b) / min(c, alone)))


def measure(rounds: int = 40, burst: int = 6, bulk_rounds: int = 6, bulk_bytes: int = 8 << 20,
            timeout: float = 30.0) -> dict:
    """The JSON line's measurements (module docstring), the same on every rank. ``timeout``: the held mesh's
    collective timeout (a job's ``parallel.timeout``)."""
    hold_job_mesh(timeout)
    n = dist.get_world_size()
    steps = max(2 * (n - 1), 1)
    one = torch.zeros(1)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    for _ in range(5):
        comm.all_reduce(one, "probe")
    idle = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        comm.all_reduce(one, "probe")
        idle.append(time.perf_counter() - t0)
    wall, cpu = [], []
    for _ in range(rounds):  # compute alone: the speed a rank gets
        t0, c0 = time.perf_counter(), time.thread_time()
        compute_burst(a, w, burst)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    comm.barrier("probe")
    tiny = statistics.mean(loaded(one, a, w, rounds, burst)) / steps
    small = torch.zeros(SMALL // 4)
    loaded(small, a, w, 3, 0)  # (gloo's first calls at a new size set up its buffers)
    latency = statistics.mean(loaded(small, a, w, rounds, 0)) / steps  # back to back
    bulk = torch.zeros(bulk_bytes // 4)
    alone = statistics.median(loaded(bulk, a, w, bulk_rounds, burst))
    sent = 2 * (n - 1) / n * bulk_bytes  # what a ring all-reduce makes each rank send
    mbit = sent * 8 / 1e6 / alone if n > 1 else float("inf")
    overlap = hidden_share(bulk, a, w, alone, bulk_rounds)
    mine = torch.tensor([latency, sum(cpu) / sum(wall), statistics.median(idle) / steps, mbit, overlap, tiny],
                        dtype=torch.float64)
    stack = torch.stack(comm.all_gather(mine, "probe"))  # (ranks, 6)
    return {"latency": float(stack[:, 0].max()), "tiny_latency": float(stack[:, 5].max()),
            "speed": float(stack[:, 1].min()), "idle_latency": float(stack[:, 2].max()),
            "mbit": float(stack[:, 3].min()), "overlap": float(stack[:, 4].min()), "ranks": n}


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out = measure()
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    mesh.shutdown()  # (every rank leaves together, the held mesh's groups with the world)


if __name__ == "__main__":
    main()
