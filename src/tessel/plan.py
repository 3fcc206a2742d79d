"""The parallel plan: every decision about how one model is spread over the ranks, as frozen data.

A :class:`ParallelPlan` holds the degrees (dp × pp × tp), the tensor-parallel mode and grid, the pipeline
schedule, micro-batches and stage bounds, and each sparse table's strategy. It is made once, from the
config (``ParallelPlan.from_config``); the workers complete the two parts that need measurement (stage
bounds from a profile, table strategies from the cost model) with :meth:`ParallelPlan.with_`; it is
printed at start and stored in every checkpoint. Every package reads only its slice of it.

Feasibility is a list of predicates, each returning a reason or None (:func:`problems`), so a caller can
ask whether a plan runs without catching exceptions; :meth:`ParallelPlan.check` raises the first reason.

    >>> plan = ParallelPlan(dp=2, pp=2, tp=2, tp_mode="1d", tp_grid=(2,), schedule="1f1b", micro_batches=2)
    >>> ParallelPlan.from_json(plan.to_json()) == plan
    True
    >>> plan.mesh_axes
    (('tp', 2),)
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from .choices import ASYNC_SCHEDULES, SYNC_SCHEDULES, TORCH_SCHEDULES, TP_MODES
from .config import sparse_overrides
from .errors import CheckpointError, PlanError
from .mesh import ParallelDims
from .pipeline.predict import check_optimizer
from .pipeline.schedules import check_micro, chunks
from .tensor.grid import AXES, GridSpec


@dataclass(frozen=True)
class TableChoice:
    name: str  # the table's module path in the plain model
    strategy: str  # dense | torch-sparse | allgather | ps | alltoall
    split: str = ""  # alltoall: column | row

    @classmethod
    def of(cls, choice) -> TableChoice:
        """The plan's entry for a sparse table's decided :class:`tessel.sparse.Choice`."""
        return cls(choice.info.name, choice.strategy, choice.split if choice.strategy == "alltoall" else "")


@dataclass(frozen=True)
class ParallelPlan:
    dp: int
    pp: int = 1
    tp: int = 1
    tp_mode: str = "1d"
    tp_grid: tuple[int, ...] = (1,)  # sizes of the grid's axes (see tessel.tensor.grid.AXES)
    regather: bool = False  # 2-D/3-D: keep only shards for backward
    sequence_parallel: bool = False  # torch-1d: torch's sequence parallelism around the blocks
    schedule: str = "1f1b"
    predict: str = "v1"
    micro_batches: int = 1
    bounds: tuple[tuple[int, int], ...] = ()  # [lo, hi) layers per stage; () until the profile has cut
    tables: tuple[TableChoice, ...] = field(default_factory=tuple)  # () until the tables are decided

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims(dp=self.dp, pp=self.pp, tp=self.tp, world_size=self.world)

    @property
    def flushed(self) -> bool:
        """Whether a step ends with every micro-batch's gradient applied (single-process equivalent)."""
        return self.pp == 1 or self.schedule not in ASYNC_SCHEDULES

    @property
    def pieces(self) -> int:
        """Stages the model is cut into: pp, or two per rank for torch's interleaved and zero-bubble peers."""
        return self.pp * chunks(self.schedule) if self.pp > 1 else 1

    @property
    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        """The tensor-parallel mesh dims, outermost first: ("tp",) for 1-D, the grid's axes for 2-D/3-D."""
        if self.tp == 1 or self.tp_mode in ("1d", "torch-1d"):
            return (("tp", self.tp),)
        return tuple(zip(AXES[self.tp_mode], self.tp_grid))

    def with_(self, **changes) -> ParallelPlan:
        return dataclasses.replace(self, **changes)

    # -- data ------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tp_grid"], d["bounds"] = list(self.tp_grid), [list(b) for b in self.bounds]
        d["tables"] = [dataclasses.asdict(t) for t in self.tables]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ParallelPlan:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or "dp" not in d or set(d) - names:
            raise PlanError(f"not a parallel plan: {str(d)[:80]}; a plan has the keys {', '.join(sorted(names))}")
        return cls(**{**d, "tp_grid": tuple(d.get("tp_grid", (1,))),
                      "bounds": tuple(tuple(b) for b in d.get("bounds", ())),
                      "tables": tuple(TableChoice(**t) for t in d.get("tables", ()))})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ParallelPlan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_config(cls, cfg, world: int) -> ParallelPlan:
        """The plan the config asks for on ``world`` ranks (degrees resolved, grid chosen), unchecked."""
        p = cfg.parallel
        dims = ParallelDims.resolve(world, p.dp, p.pp, p.tp)
        grid = GridSpec.parse(cfg.tensor.mode, dims.tp, cfg.tensor.grid)
        return cls(dp=dims.dp, pp=dims.pp, tp=dims.tp, tp_mode=cfg.tensor.mode, tp_grid=grid.shape,
                   regather=cfg.tensor.regather, sequence_parallel=cfg.tensor.sequence_parallel,
                   schedule=cfg.pipeline.schedule, predict=cfg.pipeline.predict, micro_batches=cfg.train.micro_batches)

    # -- checks and printing ---------------------------------------------------------------------------

    def check(self, cfg) -> ParallelPlan:
        """The plan itself, or a PlanError naming the first reason it cannot run."""
        reasons = problems(self, cfg)
        if reasons:
            raise PlanError(reasons[0])
        return self

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"pp={self.pp}", f"tp={self.tp}"]
        if self.tp > 1:
            grid = "x".join(str(s) for s in self.tp_grid)
            parts.append(f"tensor {self.tp_mode} {grid}" + (" regather" if self.regather else "")
                         + (" sequence-parallel" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"schedule {self.schedule}" + (f" ({self.predict})" if self.schedule == "async-predict"
                                                        else ""))
            if self.bounds:
                parts.append("stages " + " | ".join(f"{lo}-{hi - 1}" for lo, hi in self.bounds))
        parts.append(f"{self.micro_batches} micro-batch{'es' if self.micro_batches > 1 else ''}")
        if self.tables:
            parts.append("tables " + ", ".join(f"{t.name}={t.strategy}" + (f"/{t.split}" if t.split else "")
                                               for t in self.tables))
        return "plan: " + ", ".join(parts)


# -- feasibility: each predicate returns a reason, or None -------------------------------------------------

def _degrees(plan: ParallelPlan, cfg) -> str | None:
    if min(plan.dp, plan.pp, plan.tp) < 1 or math.prod(plan.tp_grid) != plan.tp:
        return f"degrees dp={plan.dp} pp={plan.pp} tp={plan.tp} grid {plan.tp_grid} are invalid"
    if plan.tp_mode not in TP_MODES:
        return f"tensor mode '{plan.tp_mode}' is invalid; valid: {', '.join(TP_MODES)}"
    return None


def _batch(plan: ParallelPlan, cfg) -> str | None:
    unit = plan.dp * plan.micro_batches
    b = cfg.train.global_batch
    if b % unit:
        return (f"global batch {b} is not divisible by dp={plan.dp} x micro_batches={plan.micro_batches} = "
                f"{unit}; use a multiple of {unit}, e.g. {max(unit, b // unit * unit)}")
    return None


def _schedule(plan: ParallelPlan, cfg) -> str | None:
    if plan.pp == 1:
        return None
    try:
        check_micro(plan.schedule, plan.pp, plan.micro_batches)
        if plan.schedule == "async-predict":
            check_optimizer(cfg.train.optimizer, cfg.train.momentum)
    except PlanError as e:
        return str(e)
    return None


def _tensor(plan: ParallelPlan, cfg) -> str | None:
    if plan.tp == 1:
        return None
    if cfg.model.name == "lstm_lm":
        return (f"tensor parallelism (tp={plan.tp}) applies to models transformer_lm and classifier, not lstm_lm "
                "(nn.LSTM runs its gates as one fused kernel that has no tensor-parallel form here); use tp=1")
    if plan.sequence_parallel and plan.tp_mode != "torch-1d":
        return (f"tensor.sequence_parallel with tensor.mode {plan.tp_mode}: it is torch's SequenceParallel, which "
                "only the torch-1d peer runs; valid: tensor.mode torch-1d, or tensor.sequence_parallel false")
    if plan.tp_mode == "torch-1d" and (plan.dp > 1 or plan.pp > 1 or cfg.model.name != "transformer_lm"):
        return ("tensor.mode 'torch-1d' (torch's parallelize_module, the peer) runs transformer_lm alone "
                "(dp=1, pp=1); use mode 1d to combine tensor parallelism with dp or pp")
    return None


def _sparse(plan: ParallelPlan, cfg) -> str | None:
    """Tables are served on every axis, with these exceptions (``auto`` keeps such tables dense instead)."""
    if plan.pp == 1 and plan.tp == 1:
        return None
    given = {cfg.sparse.strategy, *sparse_overrides(cfg).values()} - {"auto", "dense"}
    where = " and ".join(a for a, on in (("pp", plan.pp > 1), ("tp", plan.tp > 1)) if on)
    if "torch-sparse" in given:
        return (f"sparse torch-sparse under {where}: it is torch DDP's sparse-gradient path, which only an "
                "unpipelined, untensor-parallel model has; valid there: dense, allgather, ps, alltoall, auto")
    if plan.tp > 1 and cfg.model.softmax == "sampled" and plan.tp_mode != "1d":
        return (f"model.softmax=sampled with tp-mode {plan.tp_mode}: the sampled head reads whole hidden states, "
                "which only 1-D tensor parallelism keeps on every rank (its tables are then served over dp); valid: "
                "--tp-mode 1d, or model.softmax=full")
    if given and plan.tp > 1 and plan.tp_mode != "1d":
        return (f"sparse {', '.join(sorted(given))} with tp-mode {plan.tp_mode}: only the 1-D vocabulary shard of a "
                "table is served row by row (2-D/3-D cut its columns, torch-1d shards it inside torch); valid: "
                "--tp-mode 1d, or sparse.strategy auto/dense")
    if given and plan.pp > 1 and plan.schedule in TORCH_SCHEDULES:
        return (f"sparse {', '.join(sorted(given))} with pipeline.schedule {plan.schedule}: torch's schedules (the "
                "benchmark's peers) run a stage's forwards and backwards inside torch, where tessel cannot tag each "
                "lookup's rows with its mini-batch nor fetch the next batch's rows, so their tables stay dense; "
                "valid with tables: " + ", ".join(SYNC_SCHEDULES + ASYNC_SCHEDULES))
    return None


PREDICATES = (_degrees, _batch, _schedule, _tensor, _sparse)


def problems(plan: ParallelPlan, cfg) -> list[str]:
    """Every reason ``plan`` cannot run with ``cfg`` (empty: it can, as far as is known before the model)."""
    return [r for r in (p(plan, cfg) for p in PREDICATES) if r]


def saved_plan(meta: dict, plan: ParallelPlan, path) -> ParallelPlan:
    """The plan a checkpoint was saved under, which a resumed run must match in the pp and tp degrees. The tp mode
    and grid may differ (DCP reshards the shards), and so may dp (a job re-formed on fewer or more hosts): data
    positions count global batches, and dp replicas share one RNG stream (same seed everywhere)."""
    saved = ParallelPlan.from_dict(meta["plan"]) if "plan" in meta else plan
    if (saved.pp, saved.tp) != (plan.pp, plan.tp):
        raise CheckpointError(f"checkpoint '{path}' was saved under {saved.describe()}; a resumed run may change dp "
                              f"and the tp mode, not pp or tp, and this one is {plan.describe()}: resume with "
                              f"pp={saved.pp} and tp={saved.tp}, or start a new run from its weights with "
                              "--checkpoint.init_from")
    return saved


def regrouped(plan: ParallelPlan, saved: ParallelPlan, global_batch: int) -> ParallelPlan:
    """``plan`` for a job re-formed with another dp than ``saved``'s: the global batch stays, so each rank's share
    grows (or shrinks); the fewest micro-batches, at least ``plan``'s, that keep every micro-batch no larger than
    the saved run's keep its activation memory (3 hosts -> 2, batch 12: 4 samples per rank -> 6, as 2 x 3).

        >>> regrouped(ParallelPlan(dp=2), ParallelPlan(dp=3), 12).micro_batches
        2
        >>> regrouped(ParallelPlan(dp=4), ParallelPlan(dp=2, micro_batches=2), 16).micro_batches
        1
    """
    if saved.dp == plan.dp or global_batch % plan.dp or global_batch % (saved.dp * saved.micro_batches):
        return plan  # unchanged, or a batch the plan's own check will refuse with its reason
    size, local = global_batch // (saved.dp * saved.micro_batches), global_batch // plan.dp
    # local itself divides local: one sample per micro-batch always fits
    m = next(m for m in range(plan.micro_batches, local + 1) if local % m == 0 and local // m <= size)
    return plan.with_(micro_batches=m)
