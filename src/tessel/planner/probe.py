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
they take turns, as gloo's threads and the compute do under a tight CPU quota), ``idle_latency`` and ``wait`` (per
group size, what a 4 KiB all-reduce costs after compute bursts of a few lengths beyond what it costs back to back:
:func:`wait_after`), ``quota`` (a core's seconds per CFS period the host's CPU group allows, read from the
kernel: :func:`cpu_quota`; 0 where none is set), ``fsdp`` (per group size, the rates FSDP's all-gather and
reduce-scatter move at, called in FSDP's order: :func:`fsdp_rates`) and ``link_burst`` (bytes a link passes at
once after idling, beyond its rate: :func:`link_burst`; not measured beside a calibration trial).

Everything is timed with a data-parallel job's mesh built and held (:func:`hold_job_mesh`), as a job's process
holds its mesh's groups while it trains.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm, mesh
from ..errors import ConfigError

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


# matmuls before each call :func:`wait_after` times: none, then about 0.4, 1.4, 5.3 and 21 ms of a core
WAIT_BURSTS = (0, 1, 4, 16, 64)


def _groups_by_size(timeout: float):
    """For groups of 2, 4, 8, ... consecutive ranks and the world, each size's groups made at once (every group
    calling together, as a mesh dim's do): (size, this rank's group, whether that group is a full one; a last,
    smaller group measures but does not report). Each size's groups are destroyed once the caller's loop body is
    done with them, which ends with a gather over the world, so no call is left in them."""
    n, rank = dist.get_world_size(), dist.get_rank()
    for size in sorted({s for s in (2, 4, 8, 16, 32) if s < n} | {n}) if n > 1 else []:
        group, made = dist.new_subgroups_by_enumeration(
            [list(range(s, min(s + size, n))) for s in range(0, n, size)], timeout=timedelta(seconds=timeout))
        yield size, group, rank < n - n % size
        for g in made:
            dist.destroy_process_group(g)


def wait_after(a: torch.Tensor, w: torch.Tensor, rounds: int = 12, timeout: float = 30.0) -> list[list[float]]:
    """[[group size, a core's seconds of compute before a call, seconds the call takes beyond its back-to-back
    time], ...] over groups of 2, 4, 8, ... consecutive ranks (as tensor-parallel groups are, every group calling at
    once) and the world: a burst, then a 4 KiB all-reduce in the group, the call timed from the end of the rank's own
    burst (mean over ``rounds`` and over the ranks of full groups).

    Under a CPU quota a host's unused budget is lost at the end of each period, and a rank that waits for a throttled
    peer idles: a call after compute cost 7-18 ms more than back to back on 8 hosts of a quarter core after 5 ms of
    CPU, growing with the compute and the group (bench/plan-probe-groups/after_mesh.txt). Back to back it costs
    ``latency``'s ring steps; :meth:`tessel.planner.topology.Topology.wait` prices the rest. Each size's groups (their
    collectives time out after ``timeout`` seconds) are destroyed once timed."""
    small = torch.zeros(SMALL // 4)
    out = []
    for size, group, full in _groups_by_size(timeout):
        for _ in range(3):
            comm.all_reduce(small, "probe", group=group)
        mine = []
        for burst in WAIT_BURSTS:
            comm.barrier("probe")
            walls, cpus = [], []
            for _ in range(rounds):
                c0 = time.thread_time()
                compute_burst(a, w, burst)
                cpus.append(time.thread_time() - c0)
                t0 = time.perf_counter()
                comm.all_reduce(small, "probe", group=group)
                walls.append(time.perf_counter() - t0)
            mine += [statistics.mean(cpus), statistics.mean(walls), float(full)]
        got = torch.stack(comm.all_gather(torch.tensor(mine, dtype=torch.float64), "probe"))  # (ranks, 3 x bursts)
        got = got[got[:, 2] > 0].reshape(-1, len(WAIT_BURSTS), 3).mean(0)  # (bursts, 3): over full groups' ranks
        out += [[size, float(cpu), max(0.0, float(wall - got[0, 1]))] for cpu, wall, _ in got.tolist()]
    return out


# bytes of the gathered tensor :func:`fsdp_rates` times: an FSDP unit's gather on the benchmarks' models
FSDP_BYTES = 4 << 20


def fsdp_rates(a: torch.Tensor, w: torch.Tensor, rounds: int = 4, timeout: float = 30.0) -> list[list[float]]:
    """[[group size, Mbit/s of the all-gather, of the reduce-scatter], ...] over groups of 2, 4, 8, ... consecutive
    ranks, every group calling at once, and the world: FSDP's two collectives as tessel.comm runs them for FSDP2
    (tessel.fsdp), on a 4 MiB tensor, called in FSDP's order: ``rounds`` gathers (a forward), then ``rounds``
    (gather, reduce-scatter) pairs (a backward), one matmul between calls and no barrier, the slowest rank's median
    of each kind; a rank sends (g - 1)/g of the tensor.

    In that order, calls follow one another with a queue still on the link. Timed one at a time after a barrier (this
    probe until 2026-12-07), the gathers on 2 whole-core hosts at 100 Mbit/s moved 71-94 Mbit/s, but 54-60 in FSDP's
    order and the reduce-scatters 49, which is what the job's own calls ran at (bench/fsdp-rate/)."""
    out = []
    for size, group, full in _groups_by_size(timeout):
        part = torch.zeros(FSDP_BYTES // 4 // size)
        whole = torch.zeros(part.numel() * dist.get_world_size(group))
        calls = {"gather": partial(comm.all_gather_into, whole, part, "probe", group),
                 "scatter": partial(comm.reduce_scatter, part, whole, "probe", group)}
        for call in calls.values():
            call()  # (gloo's first call at a size sets up its buffers)
        walls: dict[str, list[float]] = {"gather": [], "scatter": []}
        compute_burst(a, w, 6)
        comm.barrier("probe")
        for kind in ["gather"] * rounds + ["gather", "scatter"] * rounds:  # a forward's gathers, then a backward's
            compute_burst(a, w, 1)
            t0 = time.perf_counter()
            calls[kind]()
            walls[kind].append(time.perf_counter() - t0)
        sent = (size - 1) / size * whole.numel() * 4 * 8 / 1e6  # Mbit a rank sends a call
        mine = [sent / max(statistics.median(walls[k]), 1e-9) for k in ("gather", "scatter")] + [float(full)]
        got = torch.stack(comm.all_gather(torch.tensor(mine, dtype=torch.float64), "probe"))  # (ranks, 3)
        got = got[got[:, 2] > 0]
        out.append([size, float(got[:, 0].min()), float(got[:, 1].min())])
    return out


# seconds a link is left idle before :func:`link_burst` sends: a token bucket refills in its size over its rate (the
# emulated links' in 1/250 s, or 32 KiB's time at a slow rate: 5 ms at 50 Mbit/s)
IDLE = 0.05


def link_burst(mbit: float, rounds: int = 3, idle: float = IDLE) -> float:
    """Bytes a link passes at once after idling, beyond what its rate moves: the first and last ranks (on different
    hosts where there are several) exchange, after ``idle`` seconds of quiet each, a message of one element and two
    big ones, of S = 1 MiB or 20 ms at ``mbit`` (the larger, at most 8 MiB) and of 2S, each with a one-element answer;
    the burst is where the line through the two big ones' seconds meets the one-element message's (:func:`burst_fit`),
    the median of ``rounds``, the same on every rank. A shaped link with a token bucket passes its bucket at once (the
    emulated cluster's tbf: 1/250 s of its rate, at least 32 KiB), so a pipeline's first activation crosses a
    boundary after the stage idled faster than its bytes over the rate.

    The line's slope is the rate the big messages moved at, not ``mbit``: taken from one message at ``mbit`` (this
    probe until 2026-12-07) a few percent off in the rate moved the burst by tens of KiB, 97 to 246 KB on 3 hosts at
    300 Mbit/s, where the crossings of 128 KiB to 2 MiB fit a bucket of about 140 KB (bench/plan-burst/sizes.jsonl)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if n < 2 or not mbit < float("inf"):
        return 0.0
    size = int(min(8 << 20, max(1 << 20, mbit * 1e6 / 8 * 0.02))) // 4 * 4
    msgs, ack = (torch.zeros(1), torch.zeros(size // 4), torch.zeros(size // 2)), torch.zeros(1)
    got = []
    for _ in range(rounds):
        tiny, once, twice = (crossing(msg, ack, idle) for msg in msgs)
        got.append(burst_fit(size, once, twice, tiny))
    mine = torch.tensor([statistics.median(got) if rank == 0 else 0.0], dtype=torch.float64)
    return float(torch.stack(comm.all_gather(mine, "probe")).max())


def crossing(msg: torch.Tensor, ack: torch.Tensor, idle: float = IDLE) -> float:
    """Seconds for ``msg`` to cross from the first rank to the last after every rank has been quiet ``idle`` seconds,
    and a one-element ``ack`` to come back (timed on those two ranks; the others only wait at the barrier)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    peer = {0: n - 1, n - 1: 0}.get(rank)
    comm.barrier("probe")
    time.sleep(idle)
    t0 = time.perf_counter()
    if rank == 0:  # the message there, its one-element answer back
        comm.send(msg, peer, "probe")
        comm.recv(ack, peer, "probe")
    elif rank == n - 1:
        comm.recv(msg, peer, "probe")
        comm.send(ack, peer, "probe")
    return time.perf_counter() - t0


def burst_fit(size: int, seconds: float, twice: float, tiny: float) -> float:
    """The bytes that crossed at once, from a ``size``-byte message's ``seconds`` and a 2·``size``-byte one's
    (``twice``) beside a one-element message's (``tiny``): the big messages' rate is the bytes between them over the
    seconds between them, and the burst the bytes of the first that its seconds beyond ``tiny`` did not move at that
    rate, from none to all of it.

        >>> # 1 MiB in 25.8 ms and 2 MiB in 55.1 ms where one element takes 0.4 ms (3 hosts at 300 Mbit/s)
        >>> round(burst_fit(1 << 20, 0.0258, 0.0551, 0.0004))
        139572
        >>> # the first as fast as one element, or the second no slower than the first: all of it
        >>> burst_fit(1 << 20, 0.5, 1.0, 0.5), burst_fit(1 << 20, 0.03, 0.03, 0.001)
        (1048576.0, 1048576.0)
    """
    if not twice > seconds:
        return float(size)
    rate = size / (twice - seconds)  # bytes a second
    return float(min(size, max(0.0, size - (seconds - tiny) * rate)))


def beside_trial(rounds: int = 12, timeout: float = 30.0) -> dict:
    """What a calibration trial does not measure, the same on every rank: ``wait`` (:func:`wait_after`), ``quota``
    (the smallest host's :func:`cpu_quota`) and ``fsdp`` (:func:`fsdp_rates`). Timed with a data-parallel job's mesh
    held, as :func:`measure` times the rest; ``--plan auto`` with a trial runs this beside it."""
    hold_job_mesh(timeout)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    wait = wait_after(a, w, rounds, timeout)
    rates = fsdp_rates(a, w, timeout=timeout)
    quota = torch.tensor([cpu_quota()], dtype=torch.float64)
    return {"wait": wait, "quota": float(torch.stack(comm.all_gather(quota, "probe")).min()), "fsdp": rates}


def cpu_quota(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float:
    """A core's seconds per CFS period this process's CPU group may run, with the unused quota it may carry into a
    period: cgroup v1 ``cpu.cfs_quota_us`` (+ ``cpu.cfs_burst_us``), v2 ``cpu.max`` (+ ``cpu.max.burst``), in the
    process's own group or, where that path is not mounted (a container on v1 without a cgroup namespace), the
    mount's root; on an emulated host, whose namespace hides its cgroup, what the cluster says it set
    (TESSEL_HOST_CFS_QUOTA_US). 0 where no quota is set or none can be read. A host that has idled runs that much at
    a whole core before its quota throttles it (Topology.after_idle)."""
    given = os.environ.get("TESSEL_HOST_CFS_QUOTA_US", "")
    if given:
        if not given.isdigit():
            raise ConfigError(f"TESSEL_HOST_CFS_QUOTA_US is '{given}'; it must be a whole number of microseconds, or "
                              "unset")
        return int(given) / 1e6
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            got = _quota_in(root / "cpu", path, "cpu.cfs_quota_us", "cpu.cfs_burst_us")
        elif controllers == "":
            got = _quota_in(root, path, "cpu.max", "cpu.max.burst")
        else:
            continue
        if got is not None:
            return got
    return 0.0


def _quota_in(mount: Path, path: str, quota_file: str, burst_file: str) -> float | None:
    """The quota (with its burst) in seconds a period in the group at ``path`` under ``mount`` (or the mount's root
    where that path is absent); 0 for no quota; None where neither holds ``quota_file``."""
    for group in (mount / path.lstrip("/"), mount):
        try:
            text = (group / quota_file).read_text().split()
        except OSError:
            continue
        if not text or text[0] in ("max", "-1"):
            return 0.0
        try:
            burst = int((group / burst_file).read_text().split()[0]) if (group / burst_file).exists() else 0
            return (int(text[0]) + burst) / 1e6
        except (OSError, ValueError, IndexError):
            return 0.0
    return None


def measure(rounds: int = 40, burst: int = 6, bulk_rounds: int = 6, bulk_bytes: int = 8 << 20,
            timeout: float = 30.0, wait_rounds: int = 12) -> dict:
    """The JSON line's measurements (module docstring), the same on every rank. ``timeout``: the held mesh's
    collective timeout (a job's ``parallel.timeout``); ``wait_rounds``: calls :func:`wait_after` times per group and
    burst."""
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
            "mbit": float(stack[:, 3].min()), "overlap": float(stack[:, 4].min()), "ranks": n,
            "link_burst": link_burst(float(stack[:, 3].min())), **beside_trial(wait_rounds, timeout)}


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out = measure()
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    mesh.shutdown()  # (every rank leaves together, the held mesh's groups with the world)


if __name__ == "__main__":
    main()
