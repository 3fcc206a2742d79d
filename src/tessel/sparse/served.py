"""The tables :func:`tessel.sparse.serve` took out of a model, as one object the step reduces and updates.

``begin_step`` before a step's forward (scheduled ``alltoall`` tables fetch this and the next step's rows),
``final_backward`` before each backward, ``reduce`` after the step's backward passes (row gradients to their
owners; returns their global squared norm for clipping), ``step`` to update the rows; ``state_dict`` gathers the
whole tables for checkpoints.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist

from .. import comm
from .alltoall import AllToAllTable
from .plan import Choice
from .schedule import Clock
from .tables import PSTable, RowTable, load_table_state, push_fused, table_state


class SparseTables:
    """The tables ``shard`` replaced, with the plan that chose them; reduce and update them each step."""

    def __init__(self, choices: list[Choice], tables: dict[str, RowTable], group, lr: float,
                 clock: Clock | None = None, link=None):
        self.choices, self.tables, self.group, self.lr = choices, tables, group, lr
        self.clock, self.link = clock or Clock(), link
        self.shards_group = None  # the tp group when these tables are vocabulary shards (their norms add up)

    def __bool__(self) -> bool:
        return bool(self.tables)

    def begin_step(self, batch, upcoming=None) -> None:
        """Before a step's forward pass: fetch this step's rows if not yet coming, start the next step's.

        Only scheduled ``alltoall`` tables whose ids begin with a batch tensor act on it. ``batch``: the step's
        whole tensors in the model's argument order (all micro-batches; ``(inputs, targets)``, or the inputs
        alone), ``upcoming`` the next step's alike (None on the last step). A table is fetched for the tensor its
        ids begin with (:attr:`tessel.sparse.detect.TableInfo.ahead`): a language model's input embedding for the
        inputs, a sampled softmax's table for the targets."""
        now, nxt = _tensors(batch), _tensors(upcoming)
        for t in self.tables.values():
            if isinstance(t, AllToAllTable):
                t.prefetch(_at(now, t.feed), _at(nxt, t.feed))

    @contextlib.contextmanager
    def whole(self):
        """An evaluation forward's context: a sharded table's ``weight`` is the whole table, as a full softmax
        reads it (gathered at its first read, a collective, and dropped at the end; lookups by id stay as they are)."""
        for t in self.tables.values():
            t.evaluating = True
        try:
            yield
        finally:
            for t in self.tables.values():
                t.evaluating, t.gathered = False, None

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

    def timing(self) -> tuple[float, dict[str, float], float]:
        """Since the last call, for the ``alltoall`` tables: (seconds with their collectives in flight, seconds
        the trainer waited for them by what it waited for (:data:`tessel.sparse.schedule.WAITS`), seconds of
        their own work outside those waits); 1 - waited/busy is the share hidden behind computation."""
        return self.clock.take()

    def tag(self, batch: int) -> None:
        """Mark the forwards that follow as mini-batch ``batch``'s (asynchronous pipelines, see ``reduce``)."""
        for t in self.tables.values():
            t.tag = batch

    def reduce(self, upto: int | None = None) -> torch.Tensor:
        """Move this step's row gradients (of forwards tagged ``upto`` or earlier: a later mini-batch's
        forwards may already have run); returns their global squared norm (for clipping)."""
        device = next(iter(self.tables.values())).table.device
        sharded = torch.zeros((), dtype=torch.float64, device=device)
        replicated = torch.zeros((), dtype=torch.float64, device=device)
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

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor the replaced tables hold now (what a peak measured from here on starts with)."""
        return [t for table in self.tables.values() for t in table.held_tensors()]

    def looked_up(self) -> dict[str, float]:
        """Table -> unique rows this rank looked up per step, of the rows it serves (a vocabulary shard's part),
        in the batches its tables were measured on."""
        return {c.info.name: c.info.unique_per_step for c in self.choices if c.info.name in self.tables}

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


class TableUse(NamedTuple):
    """What the ranks' tables measured and do, for the memory prediction: table -> the most unique rows a rank looks
    up per step (of the rows it serves), and the tables that fetch the next step's rows during this one."""

    rows: dict[str, float]
    ahead: frozenset[str]


def table_use(tables: SparseTables | None) -> TableUse:
    """Every rank's tables' survey, as one (collective: each pipeline stage's ranks survey only the tables they
    serve, and one rank predicts every stage's memory)."""
    mine = ({}, ()) if not tables else (tables.looked_up(), tuple(
        n for n, t in tables.tables.items() if isinstance(t, AllToAllTable) and t.lookahead))
    seen = comm.all_gather_object(mine, "meta")
    rows = {name: max(r.get(name, 0.0) for r, _ in seen) for r, _ in seen for name in r}
    return TableUse(rows, frozenset(n for _, ahead in seen for n in ahead))


def _tensors(batch) -> tuple:
    """A step's tensors as a tuple: ``batch`` itself, or ``(batch,)`` for one tensor, or () for None."""
    return () if batch is None else (batch,) if torch.is_tensor(batch) else tuple(batch)


def _at(tensors: tuple, k: int):
    return tensors[k] if k < len(tensors) else None
