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

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import comm
from ..choices import SPARSE_SPLITS, SPARSE_STRATEGIES
from ..errors import PlanError
from ..mesh import host_groups, side_group
from .alltoall import AllToAllTable
from .detect import TABLE_TYPES, TableInfo, find_tables, measure, unsupported
from .partition import plan_rows
from .plan import Choice, decide_auto, forced, global_counts
from .rowopt import RowOptimizer
from .schedule import Clock
from .tables import AllGatherTable, PSTable, RowTable, full_table, load_table_state, push_fused, table_state

STRATEGIES, SPLITS = SPARSE_STRATEGIES, SPARSE_SPLITS
__all__ = ["shard", "survey", "serve", "Survey", "SparseTables", "find_tables", "full_table", "STRATEGIES"]


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
        return {n: t.strategy for n, t in self.tables.items()}

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
                    f"{i.lookups_per_step:.0f} lookups) -> {c.strategy} ({c.why})")
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


def survey(model: nn.Module, batches: list[tuple]) -> Survey:
    """Find ``model``'s tables and measure them on ``batches`` (``model(*batch)`` argument tuples, this rank's
    first batches). Run it on the whole plain model, before a pipeline cut or tensor parallelism change it."""
    infos = find_tables(model)
    return Survey(infos, 3 * measure(model, infos, batches) if infos else 0.0)


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


def check_overrides(names: list[str], overrides: dict[str, str]) -> None:
    """PlanError unless every table ``overrides`` names is one of ``names`` with a known strategy."""
    for name, s in overrides.items():
        if name not in names:
            raise PlanError(f"--sparse.tables names '{name}', which is not a table of this model; "
                            f"tables: {', '.join(names) or 'none'}")
        if s not in STRATEGIES:
            raise PlanError(f"table '{name}': strategy '{s}' is unknown; valid: {', '.join(STRATEGIES)}")


def shard(model: nn.Module, batches: list[tuple], strategy: str = "ps", optimizer: str | RowOptimizer = "adagrad",
          lr: float = 0.1, momentum: float = 0.0, group=None, overrides: dict[str, str] | None = None,
          max_touched: float = 0.5, partitions: int = 0, hosts: int | None = None,
          timeout: float = 30.0, split: str = "auto", schedule: bool = True, link_mbit: float = 0.0,
          fixed: dict[str, list[str]] | None = None, weight_decay: float = 0.0) -> SparseTables:
    """Replace ``model``'s sparse tables in place; every rank of ``group`` must call it with its own batches.

    ``batches``: a few ``model(*batch)`` argument tuples (this rank's first batches) to measure sparsity
    and, for ``ps`` and row-split ``alltoall``, balance rows over owners. The other arguments: see :func:`serve`.
    """
    check_overrides([i.name for i in find_tables(model)], dict(overrides or {}))
    return serve(model, survey(model, batches), strategy, optimizer, lr, momentum, group, overrides, max_touched,
                 partitions, hosts, timeout, split, schedule, link_mbit, fixed, weight_decay)


def serve(model: nn.Module, found: Survey, strategy: str = "ps", optimizer: str | RowOptimizer = "adagrad",
          lr: float = 0.1, momentum: float = 0.0, group=None, overrides: dict[str, str] | None = None,
          max_touched: float = 0.5, partitions: int = 0, hosts: int | None = None, timeout: float = 30.0,
          split: str = "auto", schedule: bool = True, link_mbit: float = 0.0, fixed: dict[str, list[str]] | None = None,
          weight_decay: float = 0.0, only: list[str] | None = None, agree=None) -> SparseTables:
    """Replace the surveyed tables of ``model`` (or those named in ``only``: a pipeline stage's) in place.

    ``overrides`` maps table names to strategies. ``optimizer`` (sgd | adagrad | adam | adamw, lazy: see
    :mod:`tessel.sparse.rowopt`; or a RowOptimizer, used as it is: ``momentum``/``weight_decay`` are then not read)
    updates the rows of the replaced tables, with ``weight_decay`` on the rows
    a step touches. ``hosts``: see :func:`host_groups` (``ps`` aggregates each host's rows before they cross
    its link). ``split``/``schedule``: how ``alltoall`` tables are split and whether their traffic is
    scheduled; ``link_mbit``: the link rate for ``auto`` (0: measured). ``fixed``: name -> [strategy,
    split] taken as they are (a resumed run keeps its saved plan). ``agree``: [(strategy, split)] -> the same
    for every rank that must choose alike (tensor-parallel shards of one table, each deciding over its own dp
    group, take the first shard's choices).
    """
    if strategy not in STRATEGIES:
        raise PlanError(f"sparse strategy '{strategy}' is unknown; valid: {', '.join(STRATEGIES)}")
    if split not in SPLITS:
        raise PlanError(f"alltoall split '{split}' is unknown; valid: {', '.join(SPLITS)}")
    overrides = dict(overrides or {})
    check_overrides(found.names(), overrides)
    targets = {i.name: _target(model, i) for i in found.infos if only is None or i.name in only}
    distributed = dist.is_initialized() and dist.get_world_size(group) > 1
    # making groups is collective over the world: every rank takes part, whether or not it holds tables
    layout = host_groups(group, hosts, timeout) if distributed else None
    side = side_group(group, timeout) if distributed else group
    if not targets:
        return SparseTables([], {}, group, lr)
    n_hosts = dist.get_world_size(group) // dist.get_world_size(layout[0]) if layout else (
        dist.get_world_size(group) if distributed else 1)
    choices: list[Choice | None] = []
    counts, pending = {}, []
    for source, info, _ in targets.values():
        c = forced(info, source, strategy, overrides.get(info.name), max_touched)
        if source is None:  # tensor parallelism replaced it by a layer whose rows are not whole
            if overrides.get(info.name, "dense") not in ("dense", "auto"):  # named for it: refuse, never run dense
                raise PlanError(f"table '{info.name}' is cut by columns under this tensor-parallel layout; "
                                f"{overrides[info.name]} serves whole rows; valid for it: dense")
            c = Choice(info, "dense", "held by a tensor-parallel layer, not as a table of whole rows; only 1-D "
                                      "vocabulary shards are served by rows")
        if fixed and info.name in fixed:
            c = Choice(info, fixed[info.name][0], "fixed by the plan (given, or a checkpoint's)", fixed[info.name][1])
        if c is not None and c.strategy == "auto":
            c = None
        if c is None and not distributed:
            c = Choice(info, "dense", "one rank: nothing to move")
        if c is not None and c.strategy == "alltoall" and not (fixed and info.name in fixed):
            # a column split needs a column per rank; narrower tables (a bias) go by rows
            wide = info.dim >= (dist.get_world_size(group) if distributed else 1)
            c.split = ("column" if wide else "row") if split == "auto" else split
        if c is None or c.strategy == "ps" or (c.strategy == "alltoall" and c.split == "row"):
            counts[info.name] = global_counts(info, group)
        if c is None:
            pending.append((info, counts[info.name][0]))
        choices.append(c)
    link = None
    if pending:
        decided, link = decide_auto(pending, group, n_hosts, layout, found.compute, link_mbit, schedule, split,
                                    targets[pending[0][0].name][0].weight.dtype)
        it = iter(decided)
        choices = [c if c is not None else next(it) for c in choices]
    if agree is not None:
        for c, (strategy_, split_) in zip(choices, agree([(c.strategy, c.split) for c in choices])):
            if (c.strategy, c.split) != (strategy_, split_):
                c.strategy, c.split, c.why = strategy_, split_, c.why + "; as the first tensor-parallel shard chose"
            if strategy_ in ("ps", "alltoall") and c.info.name not in counts:
                counts[c.info.name] = global_counts(c.info, group)
    opt = optimizer if isinstance(optimizer, RowOptimizer) else RowOptimizer(optimizer, lr, momentum=momentum,
                                                                             weight_decay=weight_decay)
    tables, clock, routes, row_plans = {}, Clock(), {}, []
    for choice in choices:
        info = choice.info
        module, _, holder = targets[info.name]
        if choice.strategy in ("ps", "allgather", "alltoall") and (why := info.unsupported or unsupported(module)):
            raise PlanError(f"table '{info.name}' cannot use {choice.strategy}: {why}; use dense for it")
        if choice.strategy == "torch-sparse":
            if holder is not None:
                raise PlanError(f"table '{info.name}' is a tensor-parallel shard; torch-sparse serves whole "
                                "nn.Embedding tables only; valid here: dense, allgather, ps, alltoall")
            module.sparse = True
        elif choice.strategy == "allgather":
            tables[info.name] = AllGatherTable(info.name, module, group, opt)
        elif choice.strategy == "ps" or (choice.strategy == "alltoall" and choice.split == "row"):
            # Every rank must build the same owner map: access counts summed over all ranks' samples.
            p = dist.get_world_size(group) if dist.is_initialized() else 1
            fit, held = counts.get(info.name, (info.counts[0], info.counts[-1]))
            row_plan = plan_rows(fit, held, p, partitions)
            if choice.strategy == "alltoall":  # equal owner maps become one object, so routes can be shared
                row_plan = next((q for q in row_plans if torch.equal(q.owner, row_plan.owner)), row_plan)
                row_plans.append(row_plan)
            if choice.strategy == "ps":
                tables[info.name] = PSTable(info.name, module, group, opt, row_plan, layout)
            else:
                tables[info.name] = AllToAllTable(info.name, module, side, opt, "row", row_plan, schedule,
                                                  lookahead=info.fed, clock=clock, routes=routes)
        elif choice.strategy == "alltoall":
            tables[info.name] = AllToAllTable(info.name, module, side, opt, "column", None, schedule,
                                              lookahead=info.fed, clock=clock, routes=routes)
    for name, t in tables.items():
        holder = targets[name][2]
        if holder is not None:
            holder.serve_rows(t)  # the shard's rows now come from the table, its weight is no parameter any more
            t.tp_shard = True
        else:
            _set_module(model, name, t)
    return SparseTables(choices, tables, group, lr, clock, link)
