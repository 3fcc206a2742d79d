"""Every plan the world and the model allow: enumerate, then drop the infeasible with their reason.

Candidates are every (dp, pp, tp) that multiplies to the world; for tp > 1 the 1-D layers and the 2-D and
3-D layers on every grid of tp ranks with at least two real axes (a cuboid grid suits a model whose widths
differ); for pp > 1 the flushed schedules (and, with ``allow_async``, those that change the math: stale
``async``, ``async-stash``, and ``async-predict`` with either prediction variant); micro-batches among 1,
2, 4, 8, pp and 2·pp that divide the dp-local batch.
torch's schedules and tensor-parallel peer are benchmarks' peers, not the planner's options.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import choices
from ..choices import Prediction, Schedule, TensorMode
from ..errors import PlanError, TesselError
from ..parallelize import check_model
from ..plan import ParallelPlan, problems
from ..settings import Settings


def _schedules(pp: int, allow_async: bool) -> list[tuple[Schedule, Prediction]]:
    """(schedule, prediction variant) pairs the planner weighs: tessel's own flushed ones (1F1B first), and with
    ``allow_async`` the asynchronous ones, weight prediction once per variant."""
    first = choices.prediction("v1")
    if pp == 1:
        return [(choices.schedule("1f1b"), first)]
    out = []
    for s in sorted(choices.records(Schedule), key=lambda s: (s.staleness, s.holds_all_micro)):
        if not s.planned or (s.asynchronous and not allow_async):
            continue
        variants = choices.records(Prediction) if s.weights == "predict" else [first]
        out += [(s, v) for v in sorted(variants, key=lambda v: v.staleness)]
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _shapes(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write n as a product of ``parts`` sizes."""
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in _divisors(n) for rest in _shapes(n // d, parts - 1)]


def _grids(tp: int) -> list[tuple[TensorMode, tuple[int, ...]]]:
    modes = [m for m in choices.records(TensorMode) if m.planned]
    first = next(m for m in modes if not m.needs_grid)
    if tp == 1:
        return [(first, (1,))]
    out = [(m, (tp,)) for m in modes if not m.needs_grid]
    for mode in (m for m in modes if m.needs_grid):
        # a grid with one real axis is the 1-D layout in disguise
        out += [(mode, shape) for shape in _shapes(tp, len(mode.axes)) if sum(s > 1 for s in shape) > 1]
    return out


def enumerate_plans(base: ParallelPlan, world: int, global_batch: int, allow_async: bool = False
                    ) -> list[ParallelPlan]:
    """Every candidate on ``world`` ranks, each keeping ``base``'s table policy, DDP hook and buckets; with dp > 1
    also sharded over every divisor s of dp (s = dp: FSDP; 1 < s < dp: HSDP, shards over s ranks replicated
    dp / s times; over tessel's tensor-parallel blocks where tp > 1; :func:`feasible` drops the schedules and
    tensor modes that cannot shard); each also with every layer recomputed where ``base`` keeps all activations
    (compute traded for memory: chosen only where it fits and the others do not, or is faster)."""
    keeps = [base.recompute] + ([choices.recompute("layers")] if not base.recompute.layers else [])
    return [p.with_(recompute=r) for p in _layouts(base, world, global_batch, allow_async) for r in keeps]


def _layouts(base: ParallelPlan, world: int, global_batch: int, allow_async: bool) -> list[ParallelPlan]:
    out = []
    for tp in _divisors(world):
        for pp in _divisors(world // tp):
            dp = world // (tp * pp)
            local = global_batch // dp if global_batch % dp == 0 else 0
            # (a dp the batch does not divide stays, at one micro-batch, for :func:`feasible` to refuse with why)
            micro = sorted({m for m in (1, 2, 4, 8, pp, 2 * pp) if local and local % m == 0}) if local else [1]
            for mode, grid in _grids(tp):
                for schedule, predict in _schedules(pp, allow_async):
                    for m in micro if pp > 1 else micro[:1]:
                        for shard in _divisors(dp):  # 1: replicated; dp: FSDP; between: HSDP
                            out.append(base.with_(dp=dp, pp=pp, tp=tp, tp_mode=mode, tp_grid=grid,
                                                  schedule=schedule, predict=predict, micro_batches=m, bounds=(),
                                                  tables=(), dp_shard=shard))
    return out


def feasible(plans: list[ParallelPlan], settings: Settings, build_meta: Callable[[], torch.nn.Module]
             ) -> tuple[list[ParallelPlan], list[tuple[ParallelPlan, str]]]:
    """(plans that can run, (plan, reason) for those that cannot). ``build_meta``: a fresh plain model on the meta
    device for each model check (a check changes it in place); what the model allows depends only on what
    :func:`_model_key` names, so each such key is checked once."""
    ok, dropped, checked = [], [], {}
    for plan in plans:
        reasons = problems(plan, settings)
        if not reasons:
            key = _model_key(plan, settings)
            if key not in checked:
                checked[key] = _model_refusal(build_meta(), plan, settings)
            reasons = [checked[key]] if checked[key] else []
        if reasons:
            dropped.append((plan, reasons[0]))
        else:
            ok.append(plan)
    return ok, dropped


def _model_key(plan: ParallelPlan, settings: Settings) -> tuple:
    """What :func:`tessel.parallelize.check_model` reads of ``plan``."""
    rows = settings.global_batch // (plan.dp * plan.micro_batches) if plan.tp > 1 else None
    return (plan.pieces, plan.bounds, plan.tp, plan.tp_mode, plan.tp_grid, rows, plan.recompute, plan.sparse.overrides)


def _model_refusal(model: torch.nn.Module, plan: ParallelPlan, settings: Settings) -> str | None:
    try:
        check_model(model, plan, settings)
    except (PlanError, TesselError) as e:
        return str(e)
    return None
