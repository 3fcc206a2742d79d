"""Sparsity-aware hybrid data parallelism (Parallax): dense weights by DDP, sparse tables row by row.

``shard`` finds the model's tables, measures how sparsely a step touches them, and replaces each
chosen table in place by a ``ps`` or ``allgather`` module (see :mod:`tessel.sparse.tables`). The model
code is untouched; wrap the rest in DDP afterwards (the tables are no longer parameters, so DDP leaves
them alone). In a training loop, between ``backward()`` and the dense optimizer's ``step()``::

    sparse = tessel.sparse.shard(model, [(x0, y0), (x1, y1)], strategy="ps", optimizer="adagrad", lr=0.1)
    model = DDP(model)
    ...
    loss.backward()
    sparse.reduce()          # push row gradients to their owners
    sparse.step(lr=0.1)      # owners update their rows
    dense_opt.step()

Strategies per table: ``dense`` (stays in DDP, whole gradient all-reduced), ``allgather``, ``ps``,
``alltoall`` (split over the ranks, EmbRace; :mod:`tessel.sparse.alltoall`), ``auto`` (the cost model of
:mod:`tessel.sparse.cost` picks per table), and ``torch-sparse`` (``sparse=True`` inside torch DDP as
shipped: the peer DDP-with-sparse-gradients). With scheduled ``alltoall`` tables, also call
``sparse.begin_step(inputs, next_inputs)`` before each step's forward pass so the input table's rows
are fetched a step ahead (:mod:`tessel.sparse.schedule`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import choices, comm
from ..errors import PlanError
from ..mesh import host_groups, side_group
from ..plan import TableChoice, TablePolicy
from .alltoall import AllToAllTable
from .detect import TABLE_TYPES, TableInfo, find_tables, measure, unsupported
from .partition import RowPlan, plan_rows
from .plan import Choice, decide_auto, forced, global_counts
from .rowopt import RowOptimizer
from .schedule import Clock
from .tables import AllGatherTable, PSTable, RowTable, full_table, load_table_state, push_fused, table_state

__all__ = ["shard", "survey", "serve", "Survey", "SparseTables", "find_tables", "full_table", "BUILDERS"]


class SparseTables:
    """The tables ``shard`` replaced, with the plan that chose them; reduce and update them each step."""

    def __init__(self, choices: list[Choice], tables: dict[str, RowTable], group, lr: float,
                 clock: Clock | None = None, link=None):
        self.choices, self.tables, self.group, self.lr = choices, tables, group, lr
        self.clock, self.link = clock or Clock(), link
        self.shards_group = None  # the tp group when these tables are vocabulary shards (their norms add up)

    def __bool__(self) -> bool:
        return bool(self.tables)

    def begin_step(self, inputs: torch.Tensor | None, next_inputs: torch.Tensor | None = None) -> None:
        """Before a step's forward pass: fetch this step's rows if not yet coming, start the next step's.

        Only scheduled ``alltoall`` tables fed from the batch act on it; ``inputs`` is the step's whole
        first model argument (all micro-batches), ``next_inputs`` the next step's (None on the last step)."""
        for t in self.tables.values():
            if isinstance(t, AllToAllTable):
                t.prefetch(inputs, next_inputs)

    def lookahead(self, on: bool) -> None:
        """Allow or stop fetching the next step's rows ahead (an asynchronous pipeline cannot wait for them)."""
        for t in self.tables.values():
            if isinstance(t, AllToAllTable):
                t.lookahead = on and t.lookahead

    def final_backward(self, final: bool) -> None:
        """Before each backward pass: whether it is the step's last (micro-batching). Prefetching tables
        also start sending the next step's rows that are final already, to travel behind this backward."""
        for t in self.tables.values():
            if isinstance(t, AllToAllTable):
                t.final = final
                t.launch_next()

    def timing(self) -> tuple[float, float]:
        """(seconds with sparse collectives of ``alltoall`` tables in flight, seconds the trainer waited
        for them) since the last call; 1 - waited/busy is the share hidden behind computation."""
        return self.clock.take()

    def tag(self, batch: int) -> None:
        """Mark the forwards that follow as mini-batch ``batch``'s (asynchronous pipelines, see ``reduce``)."""
        for t in self.tables.values():
            t.tag = batch

    def reduce(self, upto: int | None = None) -> torch.Tensor:
        """Move this step's row gradients (of forwards tagged ``upto`` or earlier: a later mini-batch's
        forwards may already have run); returns their global squared norm (for clipping)."""
        sharded = torch.zeros((), dtype=torch.float64)
        replicated = torch.zeros((), dtype=torch.float64)
        flat_ps = [t for t in self.tables.values() if isinstance(t, PSTable) and not t.hosts and t.world > 1]
        if len(flat_ps) > 1:
            sharded += sum(sq.double() * self._once(t) for t, sq in zip(flat_ps, push_fused(flat_ps, upto)))
        for t in self.tables.values():
            if len(flat_ps) > 1 and t in flat_ps:
                continue
            sq = t.reduce(upto).double() * self._once(t)
            if t.sharded:
                sharded += sq
            else:
                replicated += sq
        if any(t.sharded for t in self.tables.values()) and dist.is_initialized():
            comm.all_reduce(sharded, "sparse.norm", group=self.group)
        total = sharded + replicated
        if self.shards_group is not None:  # tensor-parallel shards of one table hold disjoint rows: sum them
            comm.all_reduce(total, "sparse.norm", group=self.shards_group)
        return total

    def _once(self, table: RowTable) -> float:
        """Under tensor parallelism a whole table (a sampled head) is on every rank of the tp group, and the
        norm is summed over that group: such a table counts 1/tp there, a vocabulary shard counts whole."""
        if self.shards_group is None or table.tp_shard:
            return 1.0
        return 1.0 / dist.get_world_size(self.shards_group)

    def step(self, lr: float | None = None, scale: float = 1.0) -> None:
        """Update the rows reduced by ``reduce``, gradients times ``scale`` (a clipping coefficient)."""
        for t in self.tables.values():
            t.update(self.lr if lr is None else lr, scale)

    def strategies(self) -> dict[str, str]:
        """Table name -> strategy, for every table this object took out of the model."""
        return {c.info.name: c.strategy.name for c in self.choices if c.info.name in self.tables}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Whole tables (over the group) and their row-optimizer state, keyed as the plain model's weight
        ``name.weight`` and as its optimizer state would be, ``state.name.weight.sum``... (collective)."""
        out = {}
        for n, t in self.tables.items():
            for k, v in table_state(t).items():
                out[f"{n}.weight" if k == "weight" else f"state.{n}.weight.{k.removeprefix('row.')}"] = v
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for n, t in self.tables.items():
            load_table_state(t, {"weight": state[f"{n}.weight"], **{
                f"row.{k}": state[f"state.{n}.weight.{k}"] for k in t.state}})

    def memory_bytes(self) -> int:
        """Bytes this rank holds for the replaced tables: table or shard, row-optimizer state, and the
        rows (and their gradients) of its last batch."""
        return sum((t.table.numel() + sum(s.numel() for s in t.state.values())
                    + 2 * t.last_rows * t.embedding_dim) * t.table.element_size() for t in self.tables.values())

    def describe(self) -> str:
        lines = ["sparse tables:"]
        for c in self.choices:
            i = c.info
            line = (f"  {i.name:<16} {i.rows} x {i.dim} ({i.bytes / 2**20:.1f} MiB): touched "
                    f"{i.touched:.1%} of rows per step per rank ({i.unique_per_step:.0f} unique of "
                    f"{i.lookups_per_step:.0f} lookups) -> {c.strategy.name} ({c.why})")
            t = self.tables.get(i.name)
            if isinstance(t, AllToAllTable):
                how = [f"{t.split} split"] + ["scheduled"] * t.schedule + ["prefetched"] * t.lookahead
                line += f" [{', '.join(how)}]"
            if isinstance(t, (PSTable, AllToAllTable)) and t.plan is not None:
                line += f"\n{'':<19}{t.plan.describe()}"
            if plan := c.describe_plan():
                line += f"\n{plan}"
            lines.append(line)
        return "\n".join(lines)


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
    return Survey(infos, 3 * measure(model, infos, batches, run) if infos else 0.0)


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
          fixed: dict[str, list[str]] | None = None, weight_decay: float = 0.0) -> SparseTables:
    """Replace ``model``'s sparse tables in place; every rank of ``group`` must call it with its own batches.

    ``batches``: a few ``model(*batch)`` argument tuples (this rank's first batches) to measure sparsity
    and, for ``ps`` and row-split ``alltoall``, balance rows over owners. ``optimizer`` (sgd | adagrad | adam |
    adamw, lazy: see :mod:`tessel.sparse.rowopt`; or a RowOptimizer, used as it is: ``lr``, ``momentum`` and
    ``weight_decay`` are then not read) updates the rows, with ``weight_decay`` on the rows a step touches.
    ``fixed``: name -> [strategy, split] taken as they are (a resumed run keeps its saved plan). The other
    arguments make the :class:`tessel.plan.TablePolicy` that :func:`serve` follows.
    """
    policy = TablePolicy(strategy=strategy, overrides=tuple((overrides or {}).items()), split=split,
                         schedule=schedule, max_touched=max_touched, partitions=partitions, hosts=hosts or 0,
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


def _first_choice(place: _Place, policy: TablePolicy, fixed: dict[str, TableChoice], size: int) -> Choice | None:
    """A table's choice where nothing needs estimating (given, fixed, forced, or one rank), else None (auto)."""
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
    if c is not None and c.strategy.splits:
        # a column split needs a column per rank; narrower tables (a bias) go by rows
        c.split = ("column" if info.dim >= size else "row") if policy.split == "auto" else policy.split
    return c


def _row_split(c: Choice) -> bool:
    """Whether the choice's layout is an owner map balanced from access counts (ps, row-split alltoall)."""
    return c.strategy.needs_counts or c.split == "row"


def decide(places: dict[str, _Place], found: Survey, policy: TablePolicy, lay: _Layout,
           fixed: dict[str, TableChoice], agree=None) -> tuple[list[Choice], dict, object]:
    """Every held table's choice, the global access counts of those whose owner map needs them, and the link
    the cost model measured (None if nothing was left to it)."""
    picked = [_first_choice(p, policy, fixed, lay.size) for p in places.values()]
    counts = {p.info.name: global_counts(p.info, lay.group) for p, c in zip(places.values(), picked)
              if c is None or _row_split(c)}  # in table order on every rank: the sums are collectives
    pending = [p.info for p, c in zip(places.values(), picked) if c is None]
    link = None
    if pending:
        decided, link = decide_auto([(info, counts[info.name][0]) for info in pending], lay.group, lay.host_count,
                                    lay.hosts, found.compute, policy.link_mbit, policy.schedule, policy.split,
                                    places[pending[0].name].module.weight.dtype)
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
    row = b.choice.split == "row"
    return AllToAllTable(b.choice.info.name, b.place.module, b.lay.side, b.rows, b.choice.split,
                         b.row_plan() if row else None, b.policy.schedule, lookahead=b.choice.info.fed,
                         clock=b.clock, routes=b.routes)


# TableStrategy.builds -> the constructor of its table (None: the table stays in the model)
BUILDERS: dict[str, Callable[[_Build], RowTable | None]] = {
    "dense": _dense, "torch-sparse": _torch_sparse, "allgather": _allgather, "ps": _ps, "alltoall": _alltoall}


def build(picked: list[Choice], places: dict[str, _Place], counts: dict, policy: TablePolicy,
          rows: RowOptimizer | None, lay: _Layout) -> tuple[dict[str, RowTable], Clock]:
    """The serving module of every table whose strategy serves it, by its strategy's constructor."""
    tables, clock, routes, owner_maps = {}, Clock(), {}, []

    def row_plan(info: TableInfo, shared: bool) -> Callable[[], RowPlan]:
        def make() -> RowPlan:
            # Every rank must build the same owner map: access counts summed over all ranks' samples.
            fit, held = counts.get(info.name, (info.counts[0], info.counts[-1]))
            plan = plan_rows(fit, held, lay.size, policy.partitions)
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
                                                  row_plan(c.info, c.strategy.splits)))
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
          agree=None) -> SparseTables:
    """Replace the surveyed tables of ``model`` (or those named in ``only``: a pipeline stage's) in place, as
    ``policy`` says, their rows updated by ``rows``: decide each table's strategy, build its serving module,
    install it.

    ``fixed``: tables whose choice is taken as it is (a plan's, or a resumed run's). ``agree``: [(strategy,
    split)] -> the same for every rank that must choose alike (tensor-parallel shards of one table, each
    deciding over its own dp group, take the first shard's choices).
    """
    check_overrides(found.names(), policy.overrides)
    places = _places(model, found, only)
    lay = _layout(group, policy, timeout)
    lr = rows.lr if rows is not None else 0.0
    if not places:
        return SparseTables([], {}, group, lr)
    picked, counts, link = decide(places, found, policy, lay, {t.name: t for t in fixed}, agree)
    tables, clock = build(picked, places, counts, policy, rows, lay)
    install(model, tables, places)
    return SparseTables(picked, tables, group, lr, clock, link)
