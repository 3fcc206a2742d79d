"""Timing on this machine's CPU, steady against its slow spells: a model's layers at every micro-batch size in
rounds with a real one-process step beside them (the step factor, the runtime's cost per micro-batch), and what
recomputing each layer adds. What :mod:`.profile` measures a model with.

This machine runs for seconds at a time up to 1.9x slower, so every ratio here is taken within one round: the
things compared run one right after the other, and a round's ratios are combined by their median.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time

import torch

from ..chain import Runner, chain_of, recomputed
from ..pipeline.partition import LayerCost, profile
from ..settings import Settings
from ..train.engine import Engine
from ..train.optim import build_optimizer
from ..train.tail import StepTail


def optimizer_step(model: torch.nn.Module, settings: Settings):
    """A callable timing one optimizer step over ``model``'s parameters (CPU seconds); its first step, which
    allocates the state, is run here untimed."""
    params = list(model.parameters())
    opt = build_optimizer(params, settings)

    def step() -> float:
        for p in params:
            p.grad = torch.zeros_like(p)
        with torch.autocast(params[0].device.type, enabled=False):  # (timed among layers under the run's autocast;
            t0 = time.thread_time()  # a run's optimizer steps outside it)
            opt.step()
            seconds = time.thread_time() - t0
        model.zero_grad(set_to_none=True)
        return seconds
    step()
    return step


def recompute_shares(model, chain, x, y, sizes: tuple[int, ...], rounds: int = 5) -> list[dict]:
    """Per chain layer, recompute kind -> {size: the share of the layer's time on a micro-batch of that many samples
    (the first of ``x``, ``y``) that running it recomputed adds}, at each of ``sizes`` (:func:`shares_at`)."""
    kinds = {"none": chain, "layers": recomputed(chain, model),
             "selective": recomputed(chain, model, keep_matmuls=True)}
    at = {n: shares_at(model, kinds, x[:n], y[:n], rounds) for n in dict.fromkeys(sizes)}
    return [{k: {n: shares[i][k] for n, shares in at.items()} for k in ("layers", "selective")}
            for i in range(len(chain.layers))]


def shares_at(model, kinds: dict, x, y, rounds: int) -> list[dict]:
    """Per chain layer, recompute kind -> the share of the layer's time on this micro-batch that running it
    recomputed adds: the median over ``rounds`` of each round's ratio to that round's plain run. A round times the
    layers plain and under each kind in turn, one run each (the order reversed every other round; warmed in the
    first round only), so a ratio is taken within one of this machine's slow spells (seconds long, up to 1.9x)
    rather than across them, as each kind's fastest run was (docs/benchmarks.md, "The profile's recompute
    shares"). Equal layers (same modules, shapes, input) are timed as one."""
    ratios: dict[str, list[list[float]]] = {"layers": [], "selective": []}
    for r in range(rounds):
        secs = {}
        for kind in kinds if r % 2 == 0 else list(kinds)[::-1]:
            secs[kind] = [c.seconds for c in profile(model, kinds[kind], x, y, repeats=1, reuse=True, warm=r == 0)]
        for kind, per_round in ratios.items():
            per_round.append([t / base - 1 if base > 0 else 0.0 for t, base in zip(secs[kind], secs["none"])])
    # never cheaper for recomputing
    return [{k: max(statistics.median(rnd[i] for rnd in ratios[k]), 0.0) for k in ratios}
            for i in range(len(kinds["none"].layers))]


def steady(points: dict[int, float]) -> dict[int, float]:
    """A layer's seconds per micro-batch size, with the slowdowns this machine adds to single runs taken out:
    a larger micro-batch never costs more per sample than a smaller one (the GEMMs only get more efficient),
    and never less in all than a smaller one. Without this, one size profiled while the machine was busy
    (2x at one size was seen) makes every plan at that size look twice as slow.

        >>> steady({1: 1.0, 8: 4.0, 32: 40.0, 64: 30.0})
        {1: 1.0, 8: 4.0, 32: 16.0, 64: 30.0}
    """
    sizes = sorted(points)
    out = dict(points)
    for a, b in zip(sizes, sizes[1:]):
        out[b] = min(out[b], out[a] * b / a)
    for a, b in zip(reversed(sizes[:-1]), reversed(sizes[1:])):
        out[a] = min(out[a], out[b])
    return out


ROUNDS = 3  # the micro-batch sizes are timed in turn, this many times over


def layers_and_steps(model, chain, settings: Settings, x, y, sizes: list[int], micro: int = 1
            ) -> tuple[dict[int, list], list[tuple[float, list[float], float]], list[tuple[float, float]]]:
    """(size -> the layers' costs, per round (a real step's CPU seconds, the layers' at the global batch just
    before it, an optimizer step's just after), per round (the real step's seconds in ``micro`` micro-batches, run
    right after the optimizer's, the layers' seconds at 1/micro of the batch in that round); the last empty where
    ``micro`` is 1).

    Every size is timed once a round, in turn (the order reversed every other round), and a layer's time at a
    size is the median over the rounds of each round's fastest run. This machine runs for seconds at a time up to
    1.9x slower (one LSTM layer timed 14 to 27 ms in profiles taken one after another), so a size timed in one
    burst can land in a slow spell while the others do not. The real step (engine, step tail, optimizer: what
    the layers leave out, autograd across layers, the loss, zeroing, the norm and clip) runs right after the
    global batch's layers in every round, and an optimizer step right after it, so each round's ratio of the
    two is taken within one spell."""
    b = sizes[-1]
    step, optimizer = real_step(model, settings, x, y), optimizer_step(model, settings)
    step_many = real_step(model, settings, x, y, micro) if micro > 1 else None
    runs: dict[int, list] = {n: [] for n in sizes}
    real, many = [], []
    for r in range(ROUNDS):
        for n in sizes if r % 2 == 0 else sizes[::-1]:
            runs[n].append(profile(model, chain, x[:n], y[:n], repeats=1, memory=n == b and r == 0, pool=True,
                                   warm=r == 0))
            if n == b:
                real.append((step(), [c.seconds for c in runs[n][-1]], optimizer()))
                if step_many:
                    many.append(step_many())
    many = [(t, sum(c.seconds for c in per)) for t, per in zip(many, runs[b // micro])]
    return {n: [median_run(per) for per in zip(*rounds)] for n, rounds in runs.items()}, real, many


def micro_batches_for(b: int, sizes: list[int]) -> int:
    """The micro-batches a step is timed in for :func:`per_micro`: the most, up to 16, that cut the global batch
    ``b`` into a profiled size (1: none does, as with ``measure``'s default sizes, 1 sample and a global batch
    over 16: planning passes every candidate's). The most, as what each adds is about a millisecond, inside a
    step's noise on this machine at a few micro-batches (bench/plan-micro/noise.txt)."""
    return next((m for m in range(16, 1, -1) if b % m == 0 and b // m in sizes), 1)


def per_micro(real: list[tuple[float, list[float], float]], many: list[tuple[float, float]], micro: int) -> float:
    """A core's seconds each micro-batch beyond the first adds to a one-process step beyond its layers, from
    :func:`layers_and_steps`: per round, the real step in ``micro`` micro-batches against its price at that round's step
    factor (``micro`` times its layers at 1/micro of the batch, and the optimizer), over ``micro`` - 1; the median
    of the rounds, at least 0. Each round's own factor, not the profile's median: the step in micro-batches runs
    in the same spell as that round's step and layers (see :func:`layers_and_steps`).

        >>> # a step of 1 micro-batch: 1.0 s for 0.9 s of layers and 0.1 of optimizer (factor 1); in 4 micro-batches
        >>> # 1.2 s where its layers (0.2 s each) and optimizer price 0.9
        >>> round(per_micro([(1.0, [0.5, 0.4], 0.1)] * 3, [(1.2, 0.2)] * 3, 4), 9)
        0.1
        >>> # rounds of 0.1, -0.1 and 0.2 s: their median; every round below 0: 0; one micro-batch: not timed
        >>> real = [(1.0, [0.5, 0.4], 0.1)] * 3
        >>> round(per_micro(real, [(1.2, 0.2), (0.6, 0.2), (1.5, 0.2)], 4), 9), per_micro(real, [(0.6, 0.2)] * 3, 4)
        (0.1, 0.0)
        >>> per_micro([(1.0, [0.9], 0.1)], [], 1)
        0.0
    """
    if micro < 2 or not many:
        return 0.0
    per = []
    for (step, layers, opt), (step_many, layers_many) in zip(real, many):
        factor = step / max(sum(layers) + opt, 1e-9)
        per.append((step_many - factor * (micro * layers_many + opt)) / (micro - 1))
    return max(0.0, statistics.median(per))


def step_factor(real: list[tuple[float, list[float], float]], params: int) -> tuple[float, float]:
    """(A real step's CPU time over its layers' and optimizer's, the median of the rounds' ratios; the optimizer's
    seconds per parameter element, the median over the rounds), from ``layers_and_steps``' pairs. A real step does the
    layers' work and more (autograd glue, loss, clip): a ratio under 1 can only be a round the machine slowed,
    and it would scale every plan's compute down, so the factor is at least 1.

        >>> # three rounds: ratios 1.2, 1.3 and 0.9 (a slowed round's layers); optimizer steps 0.1, 0.1, 0.2 s
        >>> factor, opt = step_factor([(1.2, [0.5, 0.4], 0.1), (2.6, [1.0, 0.9], 0.1), (0.9, [0.4, 0.4], 0.2)], 10)
        >>> round(factor, 9), round(opt, 9)
        (1.2, 0.01)
    """
    factor = statistics.median(step / max(sum(layers) + opt, 1e-9) for step, layers, opt in real)
    return max(1.0, factor), statistics.median(opt for _, _, opt in real) / max(params, 1)


def median_run(costs: tuple[LayerCost, ...]) -> LayerCost:
    """One layer's cost over the rounds: the first round's (which counted its memory), with the time and the
    forward's share of the round whose time is the median."""
    mid = sorted(costs, key=lambda c: c.seconds)[(len(costs) - 1) // 2]
    return dataclasses.replace(costs[0], seconds=mid.seconds, forward=mid.forward)


def real_step(model, settings: Settings, x, y, micro: int = 1):
    """A callable timing one real training step of a copy of the plain model in ``micro`` micro-batches (CPU
    seconds), under the run's autocast as the layers are; its first step, which makes the optimizer's state, is
    run here untimed."""
    model = copy.deepcopy(model)
    runner = Runner(model, chain_of(model))
    optimizer = build_optimizer(list(runner.parameters()), settings)
    engine = Engine(runner, StepTail(list(runner.parameters()), optimizer, settings.clip), micro, settings.lr_at,
                    autocast=settings.autocast)
    steps = iter(range(10**9))

    def step() -> float:
        # (the profile's layers run inside the run's autocast; a run's step tail and optimizer do not)
        with torch.autocast(x.device.type, enabled=False):
            t0 = time.thread_time()
            engine.step(x, y, next(steps))
            return time.thread_time() - t0
    step()
    return step
