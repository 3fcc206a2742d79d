"""The parallel plan: every decision about how one model is spread over the ranks, as frozen data.

A :class:`ParallelPlan` holds the degrees (dp × pp × tp), the tensor-parallel mode and grid, the pipeline
schedule, its prediction variant, micro-batches and stage bounds, how the sparse tables are to be held
(:class:`TablePolicy`) and each table's decided strategy, and the data-parallel sync's hook and buckets. It is
the composer's only input for parallel decisions: made once (from a config by :mod:`tessel.resolve`, by the
planner, from a plan file, or by ``tessel.prepare``), completed by the workers where measurement decides (stage
bounds from a profile, table strategies from the cost model) with :meth:`ParallelPlan.with_`, printed at
start and stored in every checkpoint. Choices are records (:mod:`tessel.choices`); a name given for one is
resolved on construction.

Feasibility is a list of predicates, each returning a reason or None (:func:`problems`), so a caller can
ask whether a plan runs without catching exceptions; :meth:`ParallelPlan.check` raises the first reason.

    >>> plan = ParallelPlan(dp=2, pp=2, tp=2, tp_mode="1d", tp_grid=(2,), schedule="1f1b", micro_batches=2)
    >>> ParallelPlan.from_json(plan.to_json()) == plan
    True
    >>> plan.mesh_axes, plan.schedule.flushed, plan.serves_tables
    ((('tp', 2),), True, True)
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import torch

from . import choices
from .choices import GRAD_REDUCE, Prediction, Recompute, Schedule, TableStrategy, TensorMode
from .errors import CheckpointError, ConfigError, PlanError
from .mesh import ParallelDims


@dataclass(frozen=True)
class TableChoice:
    """One table's decided strategy (``split``: alltoall's column | row)."""

    name: str  # the table's module path in the plain model
    strategy: TableStrategy
    split: str = ""

    def __post_init__(self) -> None:
        strategy = choices.table_strategy(self.strategy)
        object.__setattr__(self, "strategy", strategy)
        if strategy.splits and not self.split:  # a split strategy named without its split: by columns
            object.__setattr__(self, "split", "column")

    @classmethod
    def of(cls, choice) -> TableChoice:
        """The plan's entry for a sparse table's decided :class:`tessel.sparse.plan.Choice`."""
        return cls(choice.info.name, choice.strategy, choice.split)

    def describe(self) -> str:
        return f"{self.name}={self.strategy.name}" + (f"/{self.split}" if self.split else "")


def _strategy_for(table: str, name) -> TableStrategy:
    try:
        return choices.table_strategy(name)
    except ConfigError as e:
        raise ConfigError(f"table '{table}': {e}") from None


@dataclass(frozen=True)
class TablePolicy:
    """How the model's sparse tables are to be held, before they are measured: a strategy for every table
    (``auto``: the cost model decides each), per-table ``overrides``, alltoall's split and 2-D scheduling, and
    what the cost model and the row layout go by."""

    strategy: TableStrategy = field(default_factory=lambda: choices.table_strategy("auto"))
    overrides: tuple[tuple[str, TableStrategy], ...] = ()  # (table, strategy): these tables take it
    split: str = "auto"  # alltoall: column | row | auto (column unless the cost model prefers row)
    schedule: bool = True  # alltoall: overlap its traffic with backward and the next forward (EmbRace)
    prefetch_all: bool = False  # scheduled alltoall: every table fed from the batch ahead (a sampled softmax's too)
    max_touched: float = 0.5  # a table a step touches more of than this stays dense (a named strategy)
    partitions: int = 0  # ps row partitions; 0: chosen from measured access counts
    hosts: int = 0  # hosts the ranks fill, for ps local aggregation; 0: torchrun's node ranks
    link_mbit: float = 0.0  # the link rate auto prices with; 0: TESSEL_LINK_MBIT, else measured
    sample_batches: int = 2  # first batches measured for sparsity and row balance
    row_optimizer: str = "auto"  # the served rows' optimizer; auto: the dense optimizer's row mirror

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", choices.table_strategy(self.strategy))
        given = self.overrides.items() if isinstance(self.overrides, dict) else self.overrides
        # sorted: one policy has one form, so a JSON round trip and a checkpoint's identity keep it
        pairs = ((n, _strategy_for(n, s)) for n, s in given)
        object.__setattr__(self, "overrides", tuple(sorted(pairs, key=lambda t: t[0])))
        if self.split not in choices.SPARSE_SPLITS:
            raise PlanError(f"alltoall split '{self.split}' is invalid; valid: {', '.join(choices.SPARSE_SPLITS)}")

    def of(self, name: str) -> TableStrategy | None:
        """The strategy given for table ``name``, if any."""
        return dict(self.overrides).get(name)

    def given(self) -> set[TableStrategy]:
        """Every strategy named for some table (the default and the overrides)."""
        return {self.strategy, *(s for _, s in self.overrides)}

    def row_kind(self, dense: choices.Optimizer) -> str:
        """The row optimizer (tessel.sparse.rowopt kind) served rows are updated by under the dense optimizer
        ``dense``; '' where none mirrors it (then ``auto`` keeps every table dense)."""
        return dense.rows if self.row_optimizer == "auto" else choices.optimizer(self.row_optimizer).rows

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**d, "strategy": self.strategy.name, "overrides": {n: s.name for n, s in self.overrides}}


@dataclass(frozen=True)
class ParallelPlan:
    dp: int
    pp: int = 1
    tp: int = 1
    tp_mode: TensorMode = "1d"
    tp_grid: tuple[int, ...] = (1,)  # sizes of the grid's axes (tp_mode.axes)
    regather: bool = False  # 2-D/3-D: keep only shards for backward
    sequence_parallel: bool = False  # torch-1d: torch's sequence parallelism around the blocks
    schedule: Schedule = "1f1b"
    predict: Prediction = "v1"
    delay_lr: int = 0  # asynchronous: steps of PipeMare's per-stage LR rescheduling (0: off)
    micro_batches: int = 1
    bounds: tuple[tuple[int, int], ...] = ()  # [lo, hi) layers per stage; () until the profile has cut
    tables: tuple[TableChoice, ...] = ()  # () until the tables are decided
    sparse: TablePolicy = field(default_factory=TablePolicy)
    ddp_hook: bool = True  # DDP's gradients through tessel.comm (counted); False: torch DDP as shipped (the peer)
    bucket_mb: float = 0.0  # DDP's gradient buckets; 0: tessel's (parallelize.auto_bucket_mb)
    grad_reduce: str = "full"  # dp gradients (DDP, FSDP, a stage's average) reduced at full width | bf16 (asked)
    dp_shard: int = 1  # dp ranks each weight is sharded over (FSDP2, tessel.fsdp): 1 replicates (DDP), dp shards
    recompute: Recompute = "none"  # which activations each chain layer keeps for backward (the rest run again)

    def __post_init__(self) -> None:
        # names given for choices resolve to their records once, here
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        set_("tp_mode", choices.tensor_mode(self.tp_mode))
        set_("schedule", choices.schedule(self.schedule))
        set_("predict", choices.prediction(self.predict))
        set_("recompute", choices.recompute(self.recompute))
        set_("tp_grid", tuple(self.tp_grid))
        set_("bounds", tuple(tuple(b) for b in self.bounds))
        set_("tables", tuple(t if isinstance(t, TableChoice) else TableChoice(*t) for t in self.tables))

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims(dp=self.dp, pp=self.pp, tp=self.tp, world_size=self.world)

    @property
    def dp_replicate(self) -> int:
        """Replicas of each weight shard over the dp ranks: dp / dp_shard (1 under FSDP, dp under DDP)."""
        return self.dp // self.dp_shard if self.dp_shard >= 1 and self.dp % self.dp_shard == 0 else 1

    @property
    def flushed(self) -> bool:
        """Whether a step ends with every micro-batch's gradient applied (single-process equivalent)."""
        return self.pp == 1 or self.schedule.flushed

    @property
    def pieces(self) -> int:
        """Stages the model is cut into: pp, or two per rank for torch's interleaved and zero-bubble peers."""
        return self.pp * self.schedule.stages_per_rank if self.pp > 1 else 1

    @property
    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        """The tensor-parallel mesh dims, outermost first: ("tp",) for 1-D, the grid's axes for 2-D/3-D."""
        if self.tp == 1 or not self.tp_mode.needs_grid:
            return (("tp", self.tp),)
        return tuple(zip(self.tp_mode.axes, self.tp_grid))

    @property
    def serves_tables(self) -> bool:
        """Whether tables can be served by rows in this layout (else they stay with the dense parameters):
        under tensor parallelism only a 1-D vocabulary shard keeps whole rows, and torch's pipeline schedules
        run the lookups where tessel cannot tag them with their mini-batch."""
        return (self.tp == 1 or self.tp_mode.serves_tables) and (self.pp == 1 or self.schedule.serves_tables)

    @property
    def live_backward(self) -> bool:
        """Whether a stage's backward reads newer weights than its forward: ``async`` (the live weights, updated
        in place meanwhile) and ``async-predict`` with a variant that predicts again at backward time. Layers that
        keep a weight they derived at the forward (a gathered shard) must derive it again in backward then; so
        must the forward-only prediction (``opt``), whose backward reads the live weights."""
        s, v = self.schedule, self.predict
        rereads = v.again_in_backward or v.live_backward
        return self.pp > 1 and (s.weights == "stale" or (s.weights == "predict" and rereads))

    def with_(self, **changes) -> ParallelPlan:
        return dataclasses.replace(self, **changes)

    # -- data ------------------------------------------------------------------------------------------

    @property
    def reduce_dtype(self) -> torch.dtype | None:
        """The dtype data-parallel gradients are reduced in (DDP, FSDP, a pipeline stage's average); None: theirs."""
        return torch.bfloat16 if self.grad_reduce == "bf16" else None

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(tp_mode=self.tp_mode.name, schedule=self.schedule.name, predict=self.predict.name,
                 recompute=self.recompute.name,
                 tp_grid=list(self.tp_grid), bounds=[list(b) for b in self.bounds], sparse=self.sparse.to_dict(),
                 tables=[{"name": t.name, "strategy": t.strategy.name, "split": t.split} for t in self.tables])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ParallelPlan:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or "dp" not in d or set(d) - names:
            raise PlanError(f"not a parallel plan: {str(d)[:80]}; a plan has the keys {', '.join(sorted(names))}")
        sparse = d.get("sparse", {})
        if not isinstance(sparse, dict) or set(sparse) - {f.name for f in dataclasses.fields(TablePolicy)}:
            raise PlanError(f"not a table policy: {str(sparse)[:80]}")
        return cls(**{**d, "tables": tuple(TableChoice(**t) for t in d.get("tables", ())),
                      "sparse": TablePolicy(**sparse)})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ParallelPlan:
        return cls.from_dict(json.loads(text))

    # -- checks and printing ---------------------------------------------------------------------------

    def check(self, settings) -> ParallelPlan:
        """The plan itself, or a PlanError naming the first reason it cannot run with ``settings``."""
        reasons = problems(self, settings)
        if reasons:
            raise PlanError(reasons[0])
        return self

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"pp={self.pp}", f"tp={self.tp}"]
        if self.tp > 1:
            grid = "x".join(str(s) for s in self.tp_grid)
            parts.append(f"tensor {self.tp_mode.name} {grid}" + (" regather" if self.regather else "")
                         + (" sequence-parallel" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"schedule {self.schedule.name}"
                         + (f" ({self.predict.name})" if self.schedule.weights == "predict" else "")
                         + (f" delay-lr {self.delay_lr}" if self.delay_lr else ""))
            if self.bounds:
                parts.append("stages " + " | ".join(f"{lo}-{hi - 1}" for lo, hi in self.bounds))
        if self.dp_shard > 1:
            parts.append(f"weights sharded over {self.dp_shard} dp ranks (FSDP)" if self.dp_replicate == 1 else
                         f"weights sharded over {self.dp_shard} dp ranks, {self.dp_replicate} replicas (HSDP)")
        if self.recompute.layers:
            parts.append(f"recompute {self.recompute.name}")
        parts.append(f"{self.micro_batches} micro-batch{'es' if self.micro_batches > 1 else ''}")
        if self.tables:
            parts.append("tables " + ", ".join(t.describe() for t in self.tables))
        elif self.sparse != TablePolicy():
            given = ", ".join(f"{n}={s.name}" for n, s in self.sparse.overrides)
            parts.append(f"tables {self.sparse.strategy.name}" + (f" ({given})" if given else ""))
        if self.grad_reduce != "full":
            parts.append(f"dp gradients reduced in {self.grad_reduce}")
        if not self.ddp_hook or self.bucket_mb:
            parts.append(("torch DDP" if not self.ddp_hook else "DDP") + (f" {self.bucket_mb:g} MB buckets"
                                                                          if self.bucket_mb else ""))
        return "plan: " + ", ".join(parts)


# -- feasibility: each predicate returns a reason, or None -------------------------------------------------

def _degrees(plan: ParallelPlan, settings) -> str | None:
    if min(plan.dp, plan.pp, plan.tp) < 1 or math.prod(plan.tp_grid) != plan.tp:
        return f"degrees dp={plan.dp} pp={plan.pp} tp={plan.tp} grid {plan.tp_grid} are invalid"
    if plan.tp > 1 and len(plan.tp_grid) != len(plan.tp_mode.axes):
        return f"tensor grid {plan.tp_grid} has {len(plan.tp_grid)} axes; mode {plan.tp_mode.name} has " \
               f"{len(plan.tp_mode.axes)} ({', '.join(plan.tp_mode.axes)})"
    return None


def _batch(plan: ParallelPlan, settings) -> str | None:
    unit = plan.dp * plan.micro_batches
    b = settings.global_batch
    if b % unit:
        return (f"global batch {b} is not divisible by dp={plan.dp} x micro_batches={plan.micro_batches} = "
                f"{unit}; use a multiple of {unit}, e.g. {max(unit, b // unit * unit)}")
    return None


def _schedule(plan: ParallelPlan, settings) -> str | None:
    if plan.delay_lr and (plan.pp == 1 or not plan.schedule.asynchronous):
        # a flushed step has no stale stage to slow down: the rescheduling would only change the math
        return (f"pipeline.delay_lr={plan.delay_lr} rescales the LR of stale stages, which only an asynchronous "
                f"pipeline has (pp={plan.pp}, schedule {plan.schedule.name}); valid: 0, or pp > 1 with "
                "pipeline.schedule async, async-stash or async-predict")
    if plan.pp == 1:
        return None
    s, m, pp = plan.schedule, plan.micro_batches, plan.pp
    if s.micro_rule == "at_least_pp" and m < pp:
        # torch's Schedule1F1B fills every stage in its warm-up
        return f"pipeline.schedule={s.name} needs train.micro_batches >= pp ({pp}), got {m}; valid: micro_batches " \
               f">= {pp}"
    if s.micro_rule == "multiple_of_pp" and m % pp:
        # torch runs the micro-batches in rounds of pp; a partial round is refused inside torch
        return f"pipeline.schedule={s.name} needs train.micro_batches to be a multiple of pp ({pp}), got {m}; " \
               f"valid: {pp}, {2 * pp}, ..."
    if s.weights == "predict" and not settings.has_direction:
        can = sorted((o for o in choices.records(choices.Optimizer) if o.direction), key=lambda o: not o.momentum_state)
        valid = ", ".join(o.name + (" (train.momentum > 0)" if o.momentum_state else "") for o in can)
        return (f"pipeline.schedule={s.name} cannot predict weights for {settings.optimizer.name}"
                + (" without momentum" if settings.optimizer.momentum_state else "")
                + f" (the prediction extrapolates a smoothed update direction it has no rule for in this optimizer); "
                  f"valid: train.optimizer {valid}")
    return None


def _tensor(plan: ParallelPlan, settings) -> str | None:
    if plan.tp == 1:
        return None
    mode = plan.tp_mode
    if plan.sequence_parallel and not mode.sequence_parallel:
        return (f"tensor.sequence_parallel with tensor.mode {mode.name}: it is torch's SequenceParallel, which "
                "only the torch-1d peer runs; valid: tensor.mode torch-1d, or tensor.sequence_parallel false")
    if not mode.composes and (plan.dp > 1 or plan.pp > 1):
        return (f"tensor.mode '{mode.name}' (torch's parallelize_module, the peer) runs alone (dp=1, pp=1); use "
                "mode 1d to combine tensor parallelism with dp or pp")
    return None


def _sparse(plan: ParallelPlan, settings) -> str | None:
    """Tables are served on every axis, with these exceptions (``auto`` keeps such tables dense instead)."""
    named = sorted({s.name for s in plan.sparse.given() if s.served}
                   | {t.strategy.name for t in plan.tables if t.strategy.served})
    if named and not plan.sparse.row_kind(settings.optimizer):
        mirrored = ", ".join(o.name for o in choices.records(choices.Optimizer) if o.rows)
        return (f"sparse {', '.join(named)} with train.optimizer {settings.optimizer.name}: no row optimizer mirrors "
                "it, so no table can be served by rows; valid: sparse.strategy auto or dense (auto keeps the tables "
                f"dense), or sparse.optimizer {mirrored} for the rows")
    if plan.pp == 1 and plan.tp == 1:
        return None
    given = {s for s in plan.sparse.given() if s.served}
    where = " and ".join(a for a, on in (("pp", plan.pp > 1), ("tp", plan.tp > 1)) if on)
    ddp_sparse = [s.name for s in plan.sparse.given() if s.ddp_sparse]
    if ddp_sparse:
        return (f"sparse {ddp_sparse[0]} under {where}: it is torch DDP's sparse-gradient path, which only an "
                "unpipelined, untensor-parallel model has; valid there: dense, allgather, ps, alltoall, auto")
    names = ", ".join(sorted(s.name for s in given))
    if given and plan.tp > 1 and not plan.tp_mode.serves_tables:
        return (f"sparse {names} with tp-mode {plan.tp_mode.name}: only the 1-D vocabulary shard of a table is "
                "served row by row (2-D/3-D cut its columns, torch-1d shards it inside torch); valid: --tp-mode 1d, "
                "or sparse.strategy auto/dense")
    if given and plan.pp > 1 and not plan.schedule.serves_tables:
        valid = ", ".join(s.name for s in choices.records(Schedule) if s.serves_tables)
        return (f"sparse {names} with pipeline.schedule {plan.schedule.name}: torch's schedules (the "
                "benchmark's peers) run a stage's forwards and backwards inside torch, where tessel cannot tag each "
                "lookup's rows with its mini-batch nor fetch the next batch's rows, so their tables stay dense; "
                f"valid with tables: {valid}")
    return None


def _shard(plan: ParallelPlan, settings) -> str | None:
    """Sharded data parallelism runs over groups of dp_shard consecutive dp ranks (HSDP: dp / dp_shard replicas
    of each shard where dp_shard < dp), unpipelined or under tessel's flushed schedules, over tessel's own
    tensor-parallel layers (each rank's tensor-parallel block of a weight is what its dp ranks share out;
    torch's tensor parallelism runs alone, dp 1, so it never meets sharding)."""
    if plan.dp_shard == 1:
        return None
    if plan.dp_shard < 1 or plan.dp % plan.dp_shard:
        divisors = ", ".join(str(d) for d in range(1, plan.dp + 1) if plan.dp % d == 0)
        return (f"parallel.dp_shard={plan.dp_shard} with dp={plan.dp}: the dp ranks split into replicas of "
                f"dp_shard ranks each, so dp_shard must divide dp; valid: {divisors} (or 0 = dp)")
    if plan.pp > 1 and (plan.schedule.asynchronous or plan.schedule.torch_peer):
        valid = ", ".join(s.name for s in choices.records(Schedule) if s.flushed and not s.torch_peer)
        return (f"parallel.dp_shard={plan.dp_shard} with pipeline.schedule {plan.schedule.name}: sharded stages run "
                "under tessel's flushed schedules (the asynchronous ones' stashed or predicted weights would need "
                f"sharded copies, torch's run their own backward); valid: {valid}")
    ddp_sparse = [s.name for s in plan.sparse.given() if s.ddp_sparse]
    if ddp_sparse:
        return (f"sparse {ddp_sparse[0]} with parallel.dp_shard={plan.dp_shard}: it is torch DDP's sparse-gradient "
                "path, which FSDP has not; valid: dense, allgather, ps, alltoall, auto")
    return None


def _recompute(plan: ParallelPlan, settings) -> str | None:
    """A recomputed layer must see the weights its first forward saw: the asynchronous schedules' stashed or
    predicted weights exist only during that forward, and torch's tensor-parallel peer runs no chain."""
    r = plan.recompute
    if not r.layers:
        return None
    if plan.pp > 1 and plan.schedule.asynchronous:
        flushed = ", ".join(s.name for s in choices.records(Schedule) if s.flushed)
        return (f"train.recompute={r.name} with pipeline.schedule {plan.schedule.name}: the recomputed forward would "
                "run on the live weights, not the stashed or predicted ones its first forward saw; valid: "
                f"train.recompute none, or a flushed schedule ({flushed})")
    if plan.tp > 1 and plan.tp_mode.torch_peer:
        return (f"train.recompute={r.name} with tensor.mode {plan.tp_mode.name}: torch's parallelize_module runs the "
                "model whole, not as tessel's chain of layers; valid: tensor.mode 1d, 2d or 3d")
    return None


def _grad_reduce(plan: ParallelPlan, settings) -> str | None:
    """Gradients reduced in bf16: DDP's buckets as torch's bf16 compression sends them (tessel's hook over any
    backend, torch's own on NCCL only), FSDP's reduce-scatters with bf16 terms."""
    if plan.grad_reduce not in GRAD_REDUCE:
        return f"parallel.grad_reduce '{plan.grad_reduce}' is not one; valid: {', '.join(GRAD_REDUCE)}"
    if plan.grad_reduce != "full" and plan.dp_shard == 1 and not plan.ddp_hook and not torch.cuda.is_available():
        return (f"parallel.grad_reduce {plan.grad_reduce} with parallel.ddp_comm torch: torch's own bf16 hook needs "
                "NCCL on CUDA GPUs, and this machine has none; valid here: parallel.ddp_comm tessel (tessel's hook "
                "sends bf16 over gloo too), or grad_reduce full")
    return None


PREDICATES = (_degrees, _batch, _schedule, _tensor, _sparse, _shard, _recompute, _grad_reduce)


def problems(plan: ParallelPlan, settings) -> list[str]:
    """Every reason ``plan`` cannot run with ``settings`` (empty: it can, as far as is known before the model)."""
    return [r for r in (p(plan, settings) for p in PREDICATES) if r]


def saved_plan(meta: dict, plan: ParallelPlan, path) -> ParallelPlan:
    """The plan a checkpoint was saved under, which a resumed run must match in the pp and tp degrees. The tp mode
    and grid may differ (DCP reshards the shards), and so may dp (a job re-formed on fewer or more hosts): data
    positions count global batches, and dp replicas share one RNG stream (same seed everywhere)."""
    try:
        saved = ParallelPlan.from_dict(meta["plan"]) if "plan" in meta else plan
    except (PlanError, ConfigError, TypeError) as e:
        raise CheckpointError(f"checkpoint '{path}' holds a plan this tessel cannot read ({e})") from None
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
