"""Serving a model's tables: survey them on sample batches, decide each table's strategy, build its module by the
strategy's constructor (:data:`BUILDERS`), install it where the table was.

``serve`` follows a :class:`tessel.plan.TablePolicy`; ``shard`` is the same from keyword arguments, for a loop
written by hand (see :mod:`tessel.sparse`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import choices
from ..errors import PlanError
from ..mesh import host_groups, side_group
from ..plan import TableChoice, TablePolicy
from .alltoall import AllToAllTable
from .detect import TABLE_TYPES, TableInfo, find_tables, measure, unsupported
from .partition import RowPlan, plan_rows
from .plan import Choice, decide_auto, fetched_ahead, forced, global_counts
from .rowopt import RowOptimizer
from .schedule import Clock
from .served import SparseTables
from .tables import AllGatherTable, PSTable, RowTable


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


@dataclass
class Survey:
    """A plain model's tables and how sparsely sample batches touch them (no communication)."""

    infos: list[TableInfo]
    compute: float  # seconds of one training step's compute (3x the measured forward), for ``auto``

    def names(self) -> list[str]:
        return [i.name for i in self.infos]


def survey(model: nn.Module, batches: list, run=None) -> Survey:
    """Find ``model``'s tables and measure them on ``batches`` (this rank's first batches, each run as
    ``run(model, batch)``: by default ``model(**batch)`` for a dict, ``model(*batch)`` for a tuple). Run it on the
    whole plain model, before a pipeline cut or tensor parallelism change it."""
    infos = find_tables(model)
    # a model built on the meta device (tessel.materialize) has no values to run: its tables are all dense
    measurable = infos and not any(p.is_meta for p in model.parameters())
    return Survey(infos, 3 * measure(model, infos, batches, run) if measurable else 0.0)


def _target(model: nn.Module, info: TableInfo) -> tuple[nn.Module | None, TableInfo, nn.Module | None]:
    """(the nn.Embedding to serve or None if it cannot be, its info, the module holding it as a part or None).

    A module holding only rows lo..lo+n of a table (a tensor-parallel shard) says so through ``row_part()``,
    which returns (an nn.Embedding over those rows, lo), or None where its layout cuts the rows' columns too."""
    module = model.get_submodule(info.name)
    part = getattr(module, "row_part", None)
    if part is None:
        return (module if isinstance(module, TABLE_TYPES) else None), info, None
    got = part()
    if got is None:
        return None, info, module
    source, lo = got
    return source, info.restrict(lo, source.num_embeddings), module


def rows_whole(model: nn.Module, info: TableInfo) -> nn.Module | None:
    """The nn.Embedding through which ``model`` (tensor-parallel or not) holds table ``info``'s rows whole, so that
    they can be served by rows (a 1-D vocabulary shard's own rows), or None where a layer cuts their columns."""
    return _target(model, info)[0]


def check_overrides(names: list[str], overrides) -> None:
    """PlanError unless every table ``overrides`` ((name, strategy) pairs or a dict) names is one of ``names``."""
    for name, _ in (overrides.items() if isinstance(overrides, dict) else overrides):
        if name not in names:
            raise PlanError(f"--sparse.tables names '{name}', which is not a table of this model; "
                            f"tables: {', '.join(names) or 'none'}")


def shard(model: nn.Module, batches: list[tuple], strategy: str = "ps", optimizer: str | RowOptimizer = "adagrad",
          lr: float = 0.1, momentum: float = 0.0, group=None, overrides: dict[str, str] | None = None,
          max_touched: float = 0.5, partitions: int = 0, hosts: int | None = None,
          timeout: float = 30.0, split: str = "auto", schedule: bool = True, link_mbit: float = 0.0,
          fixed: dict[str, list[str]] | None = None, weight_decay: float = 0.0,
          prefetch_all: bool = False) -> SparseTables:
    """Replace ``model``'s sparse tables in place; every rank of ``group`` must call it with its own batches.

    ``batches``: a few ``model(*batch)`` argument tuples (this rank's first batches) to measure sparsity
    and, for ``ps`` and row-split ``alltoall``, balance rows over owners. ``optimizer`` (sgd | adagrad | adam |
    adamw, lazy: see :mod:`tessel.sparse.rowopt`; or a RowOptimizer, used as it is: ``lr``, ``momentum`` and
    ``weight_decay`` are then not read) updates the rows, with ``weight_decay`` on the rows a step touches.
    ``fixed``: name -> [strategy, split] taken as they are (a resumed run keeps its saved plan). The other
    arguments make the :class:`tessel.plan.TablePolicy` that :func:`serve` follows.
    """
    policy = TablePolicy(strategy=strategy, overrides=tuple((overrides or {}).items()), split=split,
                         schedule=schedule, prefetch_all=prefetch_all, max_touched=max_touched,
                         partitions=partitions, hosts=hosts or 0,
                         link_mbit=link_mbit)
    check_overrides([i.name for i in find_tables(model)], policy.overrides)
    rows = optimizer if isinstance(optimizer, RowOptimizer) else RowOptimizer(
        optimizer, lr, momentum=momentum, weight_decay=weight_decay)
    decided = tuple(TableChoice(n, s, sp) for n, (s, sp) in (fixed or {}).items())
    return serve(model, survey(model, batches), policy, rows, group, timeout=timeout, fixed=decided)


@dataclass
class _Place:
    """Where one surveyed table sits in the model, and what serving it needs."""

    module: nn.Module | None  # the nn.Embedding to serve, or None where tensor parallelism cut its rows' columns
    info: TableInfo
    holder: nn.Module | None  # a tensor-parallel shard holding it as a part (its rows come back through it)


def _device(place: _Place) -> torch.device:
    """Where the table's rows live (the ids that index its owner map arrive there)."""
    held = (p for m in (place.module, place.holder) if m is not None for p in m.parameters())
    return next((p.device for p in held), torch.device("cpu"))


def _places(model: nn.Module, found: Survey, only: list[str] | None) -> dict[str, _Place]:
    """The surveyed tables this rank holds (``only``: a pipeline stage's names)."""
    return {i.name: _Place(*_target(model, i)) for i in found.infos if only is None or i.name in only}


@dataclass
class _Layout:
    """The groups tables are served over: the dp group, its host groups (ps local aggregation), the alltoall
    tables' own group, and the world size of that dp group."""

    group: object
    hosts: tuple | None
    side: object
    size: int

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def host_count(self) -> int:
        return self.size // dist.get_world_size(self.hosts[0]) if self.hosts else self.size


def _layout(group, policy: TablePolicy, timeout: float) -> _Layout:
    """Making groups is collective over the world: every rank takes part, whether or not it holds tables."""
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    if size == 1:
        return _Layout(group, None, group, 1)
    return _Layout(group, host_groups(group, policy.hosts or None, timeout), side_group(group, timeout), size)


def _first_choice(place: _Place, policy: TablePolicy, fixed: dict[str, TableChoice], size: int,
                  mirrored: bool) -> Choice | None:
    """A table's choice where nothing needs estimating (given, fixed, forced, one rank, or no row optimizer to
    serve it with), else None (auto)."""
    info, given = place.info, policy.of(place.info.name)
    if info.name in fixed:
        f = fixed[info.name]
        return Choice(info, f.strategy, "fixed by the plan (given, or a checkpoint's)", f.split)
    if place.module is None:  # tensor parallelism replaced it by a layer whose rows are not whole
        if given is not None and (given.served or given.ddp_sparse):  # named for it: refuse, never run dense
            raise PlanError(f"table '{info.name}' is cut by columns under this tensor-parallel layout; "
                            f"{given.name} serves whole rows; valid for it: dense")
        return Choice(info, choices.table_strategy("dense"), "held by a tensor-parallel layer, not as a table of "
                                                            "whole rows; only 1-D vocabulary shards are served by rows")
    c = forced(info, place.module, policy.strategy, given, policy.max_touched)
    if c is None and size == 1:
        c = Choice(info, choices.table_strategy("dense"), "one rank: nothing to move")
    if c is None and not mirrored:  # auto never changes the math unasked; a named strategy is refused in build
        c = Choice(info, choices.table_strategy("dense"), "no row optimizer mirrors this run's optimizer")
    if c is not None and c.strategy.splits:
        # a column split needs a column per rank; narrower tables (a bias) go by rows
        c.split = split_of(info.dim, size, policy.split)
    return c


def split_of(dim: int, ranks: int, given: str) -> str:
    """An all-to-all table's split: the given one, or by columns where each of ``ranks`` gets one, else by rows
    (a bias)."""
    return ("column" if dim >= ranks else "row") if given == "auto" else given


def _row_split(c: Choice) -> bool:
    """Whether the choice's layout is an owner map balanced from access counts (ps, row-split alltoall)."""
    return c.strategy.needs_counts or c.split == "row"


def decide(places: dict[str, _Place], found: Survey, policy: TablePolicy, lay: _Layout,
           fixed: dict[str, TableChoice], agree=None, mirrored: bool = True) -> tuple[list[Choice], dict, object]:
    """Every held table's choice, the global access counts of those whose owner map needs them, and the link
    the cost model measured (None if nothing was left to it). ``mirrored``: a row optimizer can update rows."""
    picked = [_first_choice(p, policy, fixed, lay.size, mirrored) for p in places.values()]
    counts = {p.info.name: global_counts(p.info, lay.group) for p, c in zip(places.values(), picked)
              if c is None or _row_split(c)}  # in table order on every rank: the sums are collectives
    pending = [p.info for p, c in zip(places.values(), picked) if c is None]
    link = None
    if pending:
        decided, link = decide_auto([(info, counts[info.name][0]) for info in pending], lay.group, lay.host_count,
                                    lay.hosts, found.compute, policy.link_mbit, policy.schedule, policy.split,
                                    places[pending[0].name].module.weight.dtype, policy.prefetch_all)
        it = iter(decided)
        picked = [c if c is not None else next(it) for c in picked]
    if agree is not None:
        for c, (name, split) in zip(picked, agree([(c.strategy.name, c.split) for c in picked])):
            if (c.strategy.name, c.split) != (name, split):
                c.strategy, c.split = choices.table_strategy(name), split
                c.why += "; as the first tensor-parallel shard chose"
            if _row_split(c) and c.info.name not in counts:
                counts[c.info.name] = global_counts(c.info, lay.group)
    return picked, counts, link


@dataclass
class _Build:
    """What a strategy's constructor gets for one table."""

    choice: Choice
    place: _Place
    lay: _Layout
    policy: TablePolicy
    rows: RowOptimizer
    clock: Clock
    routes: dict  # alltoall tables looked up with the same ids share a route (sampled softmax weight and bias)
    row_plan: Callable[[], RowPlan]  # the owner map from every rank's access counts (ps, row-split alltoall)


def _dense(b: _Build):
    return None  # stays in the model, with the dense parameters


def _torch_sparse(b: _Build):
    if b.place.holder is not None:
        raise PlanError(f"table '{b.choice.info.name}' is a tensor-parallel shard; torch-sparse serves whole "
                        "nn.Embedding tables only; valid here: dense, allgather, ps, alltoall")
    b.place.module.sparse = True  # torch DDP sends its sparse gradient (the peer)
    return None


def _allgather(b: _Build):
    return AllGatherTable(b.choice.info.name, b.place.module, b.lay.group, b.rows)


def _ps(b: _Build):
    return PSTable(b.choice.info.name, b.place.module, b.lay.group, b.rows, b.row_plan(), b.lay.hosts)


def _alltoall(b: _Build):
    row, info = b.choice.split == "row", b.choice.info
    return AllToAllTable(info.name, b.place.module, b.lay.side, b.rows, b.choice.split, b.row_plan() if row else None,
                         b.policy.schedule, lookahead=fetched_ahead(info, b.policy.prefetch_all), clock=b.clock,
                         routes=b.routes, feed=info.ahead or 0, more=info.more)


# TableStrategy.builds -> the constructor of its table (None: the table stays in the model)
BUILDERS: dict[str, Callable[[_Build], RowTable | None]] = {
    "dense": _dense, "torch-sparse": _torch_sparse, "allgather": _allgather, "ps": _ps, "alltoall": _alltoall}


def build(picked: list[Choice], places: dict[str, _Place], counts: dict, policy: TablePolicy,
          rows: RowOptimizer | None, lay: _Layout) -> tuple[dict[str, RowTable], Clock]:
    """The serving module of every table whose strategy serves it, by its strategy's constructor."""
    tables, clock, routes, owner_maps = {}, Clock(), {}, []

    def row_plan(info: TableInfo, shared: bool, device: torch.device) -> Callable[[], RowPlan]:
        def make() -> RowPlan:
            # Every rank must build the same owner map: access counts summed over all ranks' samples.
            fit, held = counts.get(info.name, (info.counts[0], info.counts[-1]))
            plan = plan_rows(fit.cpu(), held.cpu(), lay.size, policy.partitions).to(device)  # indexed by ids there
            if shared:  # equal owner maps become one object, so alltoall routes can be shared
                plan = next((q for q in owner_maps if torch.equal(q.owner, plan.owner)), plan)
                owner_maps.append(plan)
            return plan
        return make

    for c in picked:
        place = places[c.info.name]
        if c.strategy.served and (why := c.info.unsupported or unsupported(place.module)):
            raise PlanError(f"table '{c.info.name}' cannot use {c.strategy.name}: {why}; use dense for it")
        if c.strategy.served and rows is None:
            raise PlanError(f"table '{c.info.name}' cannot use {c.strategy.name}: no row optimizer mirrors this run's "
                            "optimizer; use dense for it")
        if c.strategy.builds not in BUILDERS:
            raise PlanError(f"table strategy '{c.strategy.name}' builds '{c.strategy.builds}', which no constructor "
                            f"serves; valid: {', '.join(BUILDERS)}")
        made = BUILDERS[c.strategy.builds](_Build(c, place, lay, policy, rows, clock, routes,
                                                  row_plan(c.info, c.strategy.splits, _device(place))))
        if made is not None:
            tables[c.info.name] = made
    return tables, clock


def install(model: nn.Module, tables: dict[str, RowTable], places: dict[str, _Place]) -> None:
    """Put each serving module where its table was (a tensor-parallel shard takes its rows through it)."""
    for name, t in tables.items():
        holder = places[name].holder
        if holder is not None:
            holder.serve_rows(t)  # the shard's rows now come from the table, its weight is no parameter any more
            t.tp_shard = True
        else:
            _set_module(model, name, t)


def serve(model: nn.Module, found: Survey, policy: TablePolicy, rows: RowOptimizer | None, group=None, *,
          timeout: float = 30.0, fixed: tuple[TableChoice, ...] = (), only: list[str] | None = None,
          agree=None, wire: torch.dtype | None = None) -> SparseTables:
    """Replace the surveyed tables of ``model`` (or those named in ``only``: a pipeline stage's) in place, as
    ``policy`` says, their rows updated by ``rows``: decide each table's strategy, build its serving module,
    install it.

    ``fixed``: tables whose choice is taken as it is (a plan's, or a resumed run's). ``agree``: [(strategy,
    split)] -> the same for every rank that must choose alike (tensor-parallel shards of one table, each
    deciding over its own dp group, take the first shard's choices). ``wire``: the dtype looked-up rows cross
    in (bf16 under mixed precision; None: the table's own).
    """
    check_overrides(found.names(), policy.overrides)
    places = _places(model, found, only)
    lay = _layout(group, policy, timeout)
    lr = rows.lr if rows is not None else 0.0
    if not places:
        return SparseTables([], {}, group, lr)
    picked, counts, link = decide(places, found, policy, lay, {t.name: t for t in fixed}, agree,
                                  mirrored=rows is not None)
    tables, clock = build(picked, places, counts, policy, rows, lay)
    for t in tables.values():
        t.wire = wire if wire is not None and wire != t.dtype else None
    install(model, tables, places)
    return SparseTables(picked, tables, group, lr, clock, link)
