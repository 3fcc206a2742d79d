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

Strategies per table: ``dense`` (stays in DDP, whole gradient all-reduced), ``allgather``, ``ps``, and
``torch-sparse`` (``sparse=True`` inside torch DDP as shipped: the peer DDP-with-sparse-gradients).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .. import comm
from ..errors import PlanError
from .detect import TableInfo, find_tables, measure, unsupported
from .partition import plan_rows
from .rowopt import RowOptimizer
from .tables import AllGatherTable, PSTable, RowTable, full_table, load_table_state, push_fused, table_state

STRATEGIES = ("dense", "allgather", "ps", "torch-sparse")
__all__ = ["shard", "SparseTables", "find_tables", "full_table", "STRATEGIES"]


@dataclass
class Choice:
    info: TableInfo
    strategy: str
    why: str


class SparseTables:
    """The tables ``shard`` replaced, with the plan that chose them; reduce and update them each step."""

    def __init__(self, choices: list[Choice], tables: dict[str, RowTable], group, lr: float):
        self.choices, self.tables, self.group, self.lr = choices, tables, group, lr

    def __bool__(self) -> bool:
        return bool(self.tables)

    def reduce(self) -> torch.Tensor:
        """Move this step's row gradients; returns their global squared norm (for clipping)."""
        sharded = torch.zeros((), dtype=torch.float64)
        replicated = torch.zeros((), dtype=torch.float64)
        flat_ps = [t for t in self.tables.values() if isinstance(t, PSTable) and not t.hosts and t.world > 1]
        if len(flat_ps) > 1:
            sharded += sum(sq.double() for sq in push_fused(flat_ps))
        for t in self.tables.values():
            if len(flat_ps) > 1 and t in flat_ps:
                continue
            sq = t.reduce().double()
            if t.sharded:
                sharded += sq
            else:
                replicated += sq
        if any(t.sharded for t in self.tables.values()) and dist.is_initialized():
            comm.all_reduce(sharded, "sparse.norm", group=self.group)
        return sharded + replicated

    def step(self, lr: float | None = None, scale: float = 1.0) -> None:
        """Update the rows reduced by ``reduce``, gradients times ``scale`` (a clipping coefficient)."""
        for t in self.tables.values():
            t.update(self.lr if lr is None else lr, scale)

    def strategies(self) -> dict[str, str]:
        """Table name -> strategy, for every table this object took out of the model."""
        return {n: t.strategy for n, t in self.tables.items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Whole tables and row-optimizer state, keyed ``name.weight``, ``name.row.sum``... (collective)."""
        return {f"{n}.{k}": v for n, t in self.tables.items() for k, v in table_state(t).items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for n, t in self.tables.items():
            load_table_state(t, {k[len(n) + 1:]: v for k, v in state.items() if k.startswith(n + ".")})

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
            if isinstance(t, PSTable):
                line += f"\n{'':<19}{t.plan.describe()}"
            lines.append(line)
        return "\n".join(lines)


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _choose(info: TableInfo, module: nn.Module, strategy: str, override: str | None, max_touched: float) -> Choice:
    if override:
        return Choice(info, override, "given")
    if strategy in ("dense", "torch-sparse"):
        return Choice(info, strategy, "given for all tables")
    if info.shared_with:
        return Choice(info, "dense", f"weight shared with {', '.join(info.shared_with)}: every row gets a gradient")
    if info.touched > max_touched:
        return Choice(info, "dense", f"a step touches more than {max_touched:.0%} of its rows")
    if why := unsupported(module):
        return Choice(info, "dense", why)
    return Choice(info, strategy, "sparse")


def host_groups(group, hosts: int | None = None, timeout: float = 30.0):
    """(local group, host group) for local aggregation, or None where each rank is its own host.

    ``hosts``: how many hosts the ranks of ``group`` fill, in order (ranks 0..L-1 on the first). None
    reads torchrun's node rank (GROUP_RANK) from every rank and uses it if the layout is that regular.
    """
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    p = len(ranks)
    if hosts is None:
        mine = torch.tensor([int(os.environ.get("GROUP_RANK", "-1"))])
        nodes = [int(n) for n in comm.all_gather(mine, "sparse.plan", group)]
        count = len(set(nodes))
        regular = min(nodes) >= 0 and nodes == sorted(nodes) and all(nodes.count(n) == p // count for n in nodes)
        hosts = count if regular else p
    if p % hosts:
        raise PlanError(f"{p} ranks do not fill {hosts} hosts evenly; give a host count that divides {p}")
    if hosts in (1, p):
        return None  # one host (nothing crosses a host link) or one rank per host (nothing to aggregate)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = DeviceMesh(device, torch.tensor(ranks).reshape(hosts, p // hosts), mesh_dim_names=("host", "local"))
    out = mesh.get_group("local"), mesh.get_group("host")
    for g in out:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout), g)
    return out


def shard(model: nn.Module, batches: list[tuple], strategy: str = "ps", optimizer: str = "adagrad",
          lr: float = 0.1, momentum: float = 0.0, group=None, overrides: dict[str, str] | None = None,
          max_touched: float = 0.5, partitions: int = 0, hosts: int | None = None,
          timeout: float = 30.0) -> SparseTables:
    """Replace ``model``'s sparse tables in place; every rank of ``group`` must call it with its own batches.

    ``batches``: a few ``model(*batch)`` argument tuples (this rank's first batches) to measure sparsity
    and, for ``ps``, balance rows over owners. ``overrides`` maps table names to strategies. ``optimizer``
    (sgd | adagrad | adam, lazy for adam) updates the rows of ``ps`` and ``allgather`` tables. ``hosts``:
    see :func:`host_groups` (``ps`` aggregates each host's rows before they cross its link).
    """
    if strategy not in STRATEGIES:
        raise PlanError(f"sparse strategy '{strategy}' is unknown; valid: {', '.join(STRATEGIES)}")
    overrides = dict(overrides or {})
    infos = find_tables(model)
    names = [i.name for i in infos]
    for name, s in overrides.items():
        if name not in names:
            raise PlanError(f"--sparse.tables names '{name}', which is not a table of this model; "
                            f"tables: {', '.join(names) or 'none'}")
        if s not in STRATEGIES:
            raise PlanError(f"table '{name}': strategy '{s}' is unknown; valid: {', '.join(STRATEGIES)}")
    if not infos:
        return SparseTables([], {}, group, lr)
    measure(model, infos, batches)
    opt = RowOptimizer(optimizer, lr, momentum=momentum)
    modules = dict(model.named_modules())
    choices, tables, layout = [], {}, False
    for info in infos:
        module = modules[info.name]
        choice = _choose(info, module, strategy, overrides.get(info.name), max_touched)
        if choice.strategy in ("ps", "allgather") and (why := unsupported(module)):
            raise PlanError(f"table '{info.name}' cannot use {choice.strategy}: {why}; use dense for it")
        choices.append(choice)
        if choice.strategy == "torch-sparse":
            module.sparse = True
        elif choice.strategy == "allgather":
            tables[info.name] = AllGatherTable(info.name, module, group, opt)
        elif choice.strategy == "ps":
            # Every rank must build the same owner map: sum the access counts of all ranks' samples.
            fit, held = info.counts[0].clone(), info.counts[-1].clone()
            if dist.is_initialized():
                comm.all_reduce(fit, "sparse.plan", group=group)
                comm.all_reduce(held, "sparse.plan", group=group)
            plan = plan_rows(fit, held, dist.get_world_size(group) if dist.is_initialized() else 1, partitions)
            if layout is False:
                layout = host_groups(group, hosts, timeout) if dist.is_initialized() else None
            tables[info.name] = PSTable(info.name, module, group, opt, plan, layout)
    for name, t in tables.items():
        _set_module(model, name, t)
    return SparseTables(choices, tables, group, lr)
