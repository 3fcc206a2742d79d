"""A short trial on the job's own hosts, and the topology fitted from it: the planner calibrated.

The profile (:mod:`.profile`) times the model on one idle core of the machine that plans; the probe
(:mod:`.probe`) times a matmul burst and one all-reduce. Neither sees what a step meets on the job's hosts: the
model's own layers sharing a host's CPU budget with the other ranks, the runtime's cost for each extra
micro-batch, and every kind of collective the candidates use, at more than one size. The trial runs those on
every rank at once, between compute bursts as a step issues them, and :func:`fit` turns them into the rates the
estimate reads:

- compute ``speed``: the planner's own price of a one-process step of a rank's share of the batch (the global
  batch over the ranks, as a plan of every rank on the data axis holds it) over the wall seconds that step takes
  on each rank while every rank runs it; the slowest rank's;
- ``per_micro``: what the same step in up to 4 micro-batches costs beyond that many of the layers' runs at that
  fraction of the share, per extra micro-batch (autograd set-up, the loss, the runtime's bookkeeping), at the
  fitted speed;
- ``latency`` and ``rate_mbit``: ``seconds = steps · latency + bytes sent · 8 / rate`` fitted by least squares
  over every kind the candidates use, at two sizes each (the slowest rank's seconds): an all-reduce (DDP, the tail's
  sums, 1-D tp), an all-gather (FSDP's gathers, 2-D/3-D tp), an all-to-all (the tables), a reduce-scatter (FSDP's
  and 3-D tp's, which :func:`tessel.comm.reduce_scatter` runs as an all-to-all and a local sum) and a pipeline's
  point-to-point exchange (each rank sends to the next and receives from the one before, as stages do in 1F1B's
  steady state);
- ``overlap`` as the probe measures it.

Run on every rank (``tessel train --plan auto --plan.trial true``, ``tessel plan --trial`` on local workers,
``tessel bench plan --trial`` per cell and model). Off by default: on the emulated cluster it priced 8-host cells
better than the probe and 4-host cells worse or no better (docs/benchmarks.md, "A calibration trial").
:func:`fit` is pure, so it is tested on made-up measurements:

    >>> rows = [("all_reduce", 4, 6, 1e6, 6 * 1e-4 + 1e6 * 8 / 400e6), ("all_gather", 4, 3, 4e6, 3e-4 + 0.08)]
    >>> lat, mbit = fit_link(rows)
    >>> round(lat * 1e6), round(mbit)
    (100, 400)
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.distributed as dist

from .. import comm
from ..chain import Runner, chain_of
from ..errors import CommError
from ..train.engine import Engine
from ..train.optim import build_optimizer
from ..train.tail import StepTail
from . import probe
from .choose import Planned, choose
from .job import Job
from .profile import Profile
from .topology import Topology

SIZES = (16 << 10, 4 << 20)  # bytes of each collective's tensor: latency dominates the first, bandwidth the second
MICRO = 4  # the trial's step of many micro-batches has this many


@dataclass(frozen=True)
class Calibration:
    speed: float  # the share of one idle core a rank's step gets
    per_micro: float  # seconds each micro-batch beyond the first adds to a step, beyond its layers
    latency: float  # seconds per ring step of a collective under load
    rate_mbit: float  # Mbit/s a rank moves collective bytes at
    overlap: float  # share of an asynchronous collective hidden behind compute
    seconds: float  # how long the trial took on the slowest rank, set-up not counted
    setup: float  # seconds building the model and optimizer and the warm-up step took there
    when: str  # UTC time the trial ran

    def apply(self, topo: Topology) -> Topology:
        """``topo`` with the trial's rates (values the user gave on the command line are applied after)."""
        return replace(topo, speed=self.speed, per_micro=self.per_micro, latency=self.latency,
                       rate_mbit=self.rate_mbit, overlap=self.overlap,
                       source=f"{topo.source}, calibrated by a {self.seconds:.1f} s trial at {self.when}")


def _ring(kind: str, n: int, nbytes: int) -> tuple[int, float]:
    """(latency steps, bytes one rank sends) of one collective over ``n`` ranks on a tensor of ``nbytes``
    (the all-gather's output, the all-to-all's whole send buffer, the reduce-scatter's input, the p2p message),
    as :mod:`tessel.comm` counts them."""
    if kind == "p2p":
        return 1, float(nbytes)
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    sent = (2 if kind == "all_reduce" else 1) * (n - 1) / n * nbytes
    return steps, sent


def fit_link(rows: list[tuple[str, int, int, float, float]]) -> tuple[float, float]:
    """(latency s per step, rate Mbit/s) from rows (kind, ranks, steps, bytes sent, seconds): least squares of
    seconds = steps · latency + bytes · 8 / rate, each kept positive (a fit that would make either negative
    falls back to the other alone)."""
    a = torch.tensor([[float(r[2]), r[3] * 8 / 1e6] for r in rows], dtype=torch.float64)
    t = torch.tensor([r[4] for r in rows], dtype=torch.float64)
    lat, per_mbit = torch.linalg.lstsq(a, t.unsqueeze(1)).solution.squeeze(1).tolist()
    if per_mbit <= 0:  # bandwidth invisible at these sizes: all latency
        return float(t.sum() / a[:, 0].sum()), math.inf
    if lat < 0:  # all bandwidth
        return 0.0, float((a[:, 1] * a[:, 1]).sum() / (a[:, 1] * t).sum())
    return lat, 1.0 / per_mbit


def predicted_step(profile: Profile, samples: int, micro: int) -> float:
    """The planner's price of one one-process step of ``micro`` micro-batches of ``samples`` at speed 1."""
    layers = sum(layer.seconds(samples) for layer in profile.layers) * micro
    return profile.step_factor * (layers + profile.optimizer_per_elem * profile.params)


def fit(trial: dict, profile: Profile) -> Calibration:
    """The calibration from a trial (:func:`run_trial`'s gathered record) and the profile of the same model: the
    ratio compares like with like, a real step of the same samples (its fixed costs, the clip and the optimizer,
    do not shrink with the micro-batch)."""
    b, ranks = trial["samples"], trial["ranks"]
    micro = trial["micro"]
    whole = predicted_step(profile, b, 1)
    speeds = [whole / r["whole"] for r in ranks]
    slowest = min(range(len(ranks)), key=lambda i: speeds[i])
    speed, r = speeds[slowest], ranks[slowest]
    many = predicted_step(profile, b // micro, micro) / speed  # the layers at 1/micro of the samples, micro times
    per_micro = max(0.0, (r["many"] - many) / (micro - 1)) if micro > 1 else 0.0
    n = len(ranks)
    if n > 1:
        rows = []
        for kind, nbytes in trial["collectives"]:
            steps, sent = _ring(kind, n, nbytes)
            worst = max(x["collectives"][f"{kind}:{nbytes}"] for x in ranks)
            rows.append((kind, n, steps, sent, worst))
        latency, mbit = fit_link(rows)
    else:
        latency, mbit = 0.0, math.inf
    return Calibration(speed, per_micro, latency, mbit, min(x["overlap"] for x in ranks),
                       max(x["seconds"] for x in ranks), max(x["setup"] for x in ranks), trial["when"])


def _steps(job: Job, samples: int, micro: int, repeats: int) -> dict:
    """Median wall seconds of one-process steps of ``samples``, in one micro-batch ("whole") and in ``micro``
    ("many"), taken in alternating order after one warm-up step; "setup": seconds to that point (the model, its
    optimizer, whose first construction imports torch._dynamo, and the warm-up, which makes its state)."""
    t0 = time.perf_counter()
    settings = job.settings
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        model = job.build()
    runner = Runner(model, chain_of(model))
    tail = StepTail(list(runner.parameters()), build_optimizer(list(runner.parameters()), settings), settings.clip)
    x, y = job.batch(settings.global_batch, settings.global_batch // samples)
    engines = {"whole": Engine(runner, tail, 1, settings.lr_at), "many": Engine(runner, tail, micro, settings.lr_at)}
    engines["whole"].step(x, y, 0)
    comm.barrier("probe")  # every rank set up: the timed steps share the host's CPU as a run's steps do
    out = {"setup": time.perf_counter() - t0}
    timed: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            t0 = time.perf_counter()  # wall time: a CPU quota shows there, not in the thread's CPU time
            engine.step(x, y, 0)
            timed[name].append(time.perf_counter() - t0)
    return {**out, **{name: statistics.median(t) for name, t in timed.items()}}


def _timed(fn, repeats: int, a: torch.Tensor, w: torch.Tensor) -> float:
    """Median wall seconds of ``fn()`` issued after a compute burst, as a step issues its collectives."""
    times = []
    for _ in range(repeats + 1):
        probe.compute_burst(a, w, 2)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _collectives(repeats: int) -> dict:
    """"kind:bytes" -> median wall seconds of each kind at each size (``SIZES``)."""
    n = dist.get_world_size()
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    out = {}
    for nbytes in SIZES:
        whole, part = torch.zeros(nbytes // 4 // n * n), torch.zeros(nbytes // 4 // n)
        out[f"all_reduce:{nbytes}"] = _timed(partial(comm.all_reduce, torch.zeros(nbytes // 4), "probe"),
                                             repeats, a, w)
        out[f"all_gather:{nbytes}"] = _timed(partial(comm.all_gather_into, whole, part, "probe"), repeats, a, w)
        out[f"all_to_all:{nbytes}"] = _timed(partial(comm.all_to_all, whole.clone(), whole, "probe"), repeats, a, w)
        out[f"reduce_scatter:{nbytes}"] = _timed(partial(comm.reduce_scatter, part.clone(), whole, "probe"),
                                                 repeats, a, w)
        out[f"p2p:{nbytes}"] = _timed(partial(_exchange, torch.zeros(nbytes // 4)), repeats, a, w)
    return out


def _exchange(tensor: torch.Tensor) -> None:
    """Send ``tensor`` to the next rank and receive one from the one before, together (a pipeline's boundary)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    works = comm.batch_isend_irecv([("send", tensor, (rank + 1) % n), ("recv", torch.empty_like(tensor),
                                                                       (rank - 1) % n)], "probe")
    for work in works:
        work.wait()


def run_trial(job: Job, repeats: int = 2) -> dict:
    """Every rank runs the trial; every rank gets the gathered record (:func:`fit` reads it). "seconds" is the
    trial's own time, its set-up not counted (a run's workers build their model and optimizer anyway)."""
    b = job.settings.global_batch
    # a rank's share of the batch, as a plan of every rank on the data axis holds it: the whole batch on every rank
    # is a working set no candidate has (its 4-host trials priced the runs 27-32% too slow, median)
    samples = b // math.gcd(b, dist.get_world_size())
    micro = max(m for m in range(1, MICRO + 1) if samples % m == 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker runs
    try:
        t0 = time.perf_counter()
        mine = _steps(job, samples, micro, repeats)
        if dist.get_world_size() > 1:
            mine["collectives"] = _collectives(repeats)
            bulk = torch.zeros(SIZES[-1] // 4)
            a, w = torch.randn(64, 512), torch.randn(512, 512)
            alone = statistics.median(probe.loaded(bulk, a, w, repeats, 2))
            mine["overlap"] = probe.hidden_share(bulk, a, w, alone, repeats)
        else:
            mine["collectives"], mine["overlap"] = {}, 1.0
        mine["seconds"] = time.perf_counter() - t0 - mine["setup"]
    finally:
        torch.set_num_threads(threads)
    ranks = comm.all_gather_object(mine, "meta")
    kinds = [(k.split(":")[0], int(k.split(":")[1])) for k in ranks[0]["collectives"]]
    return {"batch": b, "samples": samples, "micro": micro, "ranks": ranks, "collectives": kinds,
            "when": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())}


def attempt(trial, say=print) -> dict | None:
    """``trial()``'s record, or None with one line said where it failed (a host that does not answer, a
    launch that fails): the planner then prices with the probe's or the defaults' rates, as without a trial."""
    try:
        return trial()
    except (CommError, OSError, RuntimeError, ValueError, KeyError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip(" =-")] or [type(e).__name__]
        # the first line says where, the last what (a worker's traceback ends with its error)
        what = lines[0][:120] + (f" ... {lines[-1][:120]}" if len(lines) > 1 else "")
        say(f"tessel: the planner's calibration trial failed ({what}); planning without it")
        return None


def describe(cal: Calibration, ranks: int) -> str:
    return (f"tessel: calibration trial {cal.seconds:.1f} s (model set-up {cal.setup:.1f} s more) on {ranks} "
            f"rank{'s' * (ranks > 1)} at {cal.when}: "
            f"compute {cal.speed:.3g}x the profile's core, {cal.per_micro * 1e3:.2f} ms per extra micro-batch, "
            f"latency {cal.latency * 1e6:.0f} us per ring step, a rank moves {cal.rate_mbit:.0f} Mbit/s, "
            f"{cal.overlap:.0%} of a collective hidden by compute")


def choose_calibrated(job: Job, topology, trial: dict | None, allow_async: bool = False, say=print) -> Planned:
    """The planner's choice on ``topology(None)``, or with a trial record, on ``topology(calibration)``: the trial
    fitted to the profile the first choice took (one profile, priced twice)."""
    planned = choose(job, topology(None), allow_async)
    if trial is None:
        return planned
    cal = fit(trial, planned.profile)
    say(describe(cal, len(trial["ranks"])))
    return choose(job, topology(cal), allow_async, profile=planned.profile)
