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
- ``latency`` and ``rate_mbit``: under the estimate's model of a call, the longer of its ring steps at the latency
  and its bytes at the rate (Topology.call_seconds), from every kind the candidates use at two sizes each (the
  slowest rank's seconds): the latency from the small calls' seconds per ring step, the rate from the large calls'
  bytes over their seconds (:func:`fit_link`). The kinds: an all-reduce (DDP, the tail's sums, 1-D tp), an
  all-gather (FSDP's gathers, 2-D/3-D tp), an all-to-all (the tables), a reduce-scatter (FSDP's and 3-D tp's, which
  :func:`tessel.comm.reduce_scatter` runs as an all-to-all and a local sum) and a pipeline's point-to-point exchange
  (each rank sends to the next and receives from the one before, as stages do in 1F1B's steady state);
- ``tiny_latency``: a one-element all-reduce's seconds per ring step (a loss's, a norm's: gloo reduces one or two
  elements by a cheaper path than any larger tensor, bench/plan-latency/calls.txt);
- ``overlap`` as the probe measures it.

Run on every rank (``tessel train --plan auto --plan.trial true``, ``tessel plan --trial`` on local workers,
``tessel bench plan --trial`` per cell and model). Off by default: on the emulated cluster it priced 4-host cells
worse than the probe or no better, and 8-host cells better on 2026-11-27 but far worse on 2026-12-07 (median 54%
against 4%: its compute speed came out 2-3.6x below the probe's; docs/benchmarks.md, "A calibration trial" and "The
calibration trial fitted as a call is priced").
:func:`fit` is pure, so it is tested on made-up measurements:

    >>> def call(steps, sent):  # 100 us a ring step, 400 Mbit/s: the longer of the two
    ...     return max(steps * 1e-4, sent * 8 / 400e6)
    >>> rows = [("all_reduce", 6, 6e3, call(6, 6e3)), ("all_reduce", 6, 6e6, call(6, 6e6)),
    ...         ("p2p", 1, 4e3, call(1, 4e3)), ("p2p", 1, 4e6, call(1, 4e6))]
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
TINY = "tiny"  # the trial's kind for a one-element all-reduce (4 bytes), priced at its own latency


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
    tiny_latency: float = 0.0  # seconds per ring step of a one-element all-reduce (0: not timed; the probe's stays)

    def apply(self, topo: Topology) -> Topology:
        """``topo`` with the trial's rates (values the user gave on the command line are applied after)."""
        return replace(topo, speed=self.speed, per_micro=self.per_micro, latency=self.latency,
                       tiny_latency=self.tiny_latency or topo.tiny_latency, rate_mbit=self.rate_mbit,
                       overlap=self.overlap,
                       source=f"{topo.source}, calibrated by a {self.seconds:.1f} s trial at {self.when}")


def _ring(kind: str, n: int, nbytes: int) -> tuple[int, float]:
    """(latency steps, bytes one rank sends) of one collective over ``n`` ranks on a tensor of ``nbytes``
    (the all-gather's output, the all-to-all's whole send buffer, the reduce-scatter's input, the p2p message),
    as :mod:`tessel.comm` counts them."""
    if kind == "p2p":
        return 1, float(nbytes)
    ring = kind in ("all_reduce", TINY)
    steps = 2 * (n - 1) if ring else n - 1
    sent = (2 if ring else 1) * (n - 1) / n * nbytes
    return steps, sent


def fit_link(rows: list[tuple[str, int, float, float]]) -> tuple[float, float]:
    """(latency s per ring step, rate Mbit/s) from rows (kind, ring steps, bytes sent, seconds) of each kind at two
    sizes, under the estimate's model: a call takes the longer of its steps' latency and its bytes' transfer. The
    latency is the median seconds per step of each kind's smaller call, those whose bytes at the fitted rate take
    under half their time (the steps decide them); the rate the median of bytes over seconds of the larger calls
    that took longer than their steps (a large call no slower per step than the small ones is all steps: bandwidth
    the trial's sizes cannot see, rate inf)."""
    smallest = {kind: min(r[2] for r in rows if r[0] == kind) for kind, *_ in rows}
    small = [r for r in rows if r[2] == smallest[r[0]]]
    latency = statistics.median(r[3] / r[1] for r in small)
    seen = [r[2] * 8 / 1e6 / r[3] for r in rows if r[2] > smallest[r[0]] and r[3] > 1.1 * r[1] * latency]
    mbit = statistics.median(seen) if seen else math.inf
    bound = [r[3] / r[1] for r in small if r[2] * 8 / 1e6 / mbit < r[3] / 2]  # (bandwidth-bound small calls out)
    return (statistics.median(bound) if bound else latency), mbit


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
            rows.append((kind, steps, sent, max(x["collectives"][f"{kind}:{nbytes}"] for x in ranks)))
        latency, mbit = fit_link([r for r in rows if r[0] != TINY])
        tiny = [r[3] / r[1] for r in rows if r[0] == TINY]  # none in a trial recorded before 2026-12-07
        tiny_latency = tiny[0] if tiny else 0.0
    else:
        latency, mbit, tiny_latency = 0.0, math.inf, 0.0
    return Calibration(speed, per_micro, latency, mbit, min(x["overlap"] for x in ranks),
                       max(x["seconds"] for x in ranks), max(x["setup"] for x in ranks), trial["when"], tiny_latency)


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
    """"kind:bytes" -> median wall seconds of each kind at each size (``SIZES``), and of a one-element all-reduce."""
    n = dist.get_world_size()
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    out = {f"{TINY}:4": _timed(partial(comm.all_reduce, torch.zeros(1), "probe"), repeats, a, w)}
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
            f"latency {cal.latency * 1e6:.0f} us per ring step"
            + (f" ({cal.tiny_latency * 1e6:.0f} us for a one-element call)" if cal.tiny_latency else "")
            + f", a rank moves {cal.rate_mbit:.0f} Mbit/s, "
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
