"""Embedding tables whose rows move sparsely: ``ps`` (sharded over owners) and ``allgather`` (replicated).

Both replace an ``nn.Embedding`` and look like it to the model (same call, same output). A forward pass
looks up the batch's unique ids once, as a leaf tensor of rows, so autograd sums the gradients of
duplicate ids into one row each; ``reduce()`` after the backward pass moves those row gradients, and
``update()`` applies the row optimizer. Rows no rank touched are neither sent nor changed.

- ``PSTable``: this rank holds only its shard (rows chosen by :mod:`tessel.sparse.partition`) and its
  optimizer state. Pull: ids go to their owners and rows come back (one uneven all_to_all each way).
  Push: the row gradients go to their owners, which sum them over ranks and update their rows.
- ``AllGatherTable``: every rank holds the whole table; every rank's (ids, row gradients) go to every
  other rank, unpadded, and each applies the same update (Horovod's and DeepSpeed's way, without padding).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import comm
from .partition import RowPlan
from .rowopt import RowOptimizer


def _splits(owner_of: torch.Tensor, p: int) -> list[int]:
    return torch.bincount(owner_of, minlength=p).tolist()


class RowTable(nn.Module, metaclass=ABCMeta):
    """Shared part: lookup through unique ids, pending row gradients, the update. A strategy supplies
    ``_lookup`` (the rows of a forward pass) and ``reduce`` (move their gradients)."""

    strategy = ""

    def __init__(self, name: str, num_rows: int, dim: int, group, opt: RowOptimizer, bag: nn.Module | None):
        super().__init__()
        self.name, self.num_embeddings, self.embedding_dim = name, num_rows, dim
        # An EmbeddingBag's pooling is kept as it was: (mode, include_last_offset).
        self.bag = (bag.mode, bag.include_last_offset) if isinstance(bag, nn.EmbeddingBag) else None
        self.group, self.opt = group, opt
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (tag, unique ids, leaf rows) per forward
        # The mini-batch the next forward belongs to: an asynchronous pipeline runs the next step's first
        # forwards before this step's update, and ``reduce(upto)`` must leave their rows for the next step.
        self.tag = 0
        self._update: tuple[torch.Tensor, torch.Tensor] | None = None  # (local rows, averaged grads)
        self.last_rows = 0  # unique rows this rank looked up in its last forward (for reports)
        self.tp_shard = False  # rows of a tensor-parallel vocabulary shard (else the whole table on every tp rank)
        # what looked-up rows and row gradients cross the wire in (bf16 under mixed precision; None: the table's
        # dtype). Rows are kept and updated, and gradients summed, in the table's dtype (fp32 masters): a received
        # gradient is widened before any sum, so only each contribution is rounded (docs/usage.md measures that
        # rounding at a sixth to a third of bf16 compute's own error)
        self.wire: torch.dtype | None = None
        # inside SparseTables.whole (an evaluation forward): the whole table, gathered at the first read of
        # ``weight`` (a full softmax's), dropped at the context's end
        self.evaluating = False
        self.gathered: torch.Tensor | None = None

    def whole_weight(self) -> torch.Tensor:
        """A sharded table's ``weight``: the whole table inside :meth:`SparseTables.whole` (gathered from its
        owners at the first read, a collective every rank's evaluation forward reaches alike), else an error."""
        if not self.evaluating:
            raise AttributeError(self._not_whole())
        if self.gathered is None:
            with torch.no_grad():
                self.gathered = full_table(self)
        return self.gathered

    def _not_whole(self) -> str:
        return (f"table '{self.name}' is spread over {self.world} ranks (strategy {self.strategy}); "
                "tessel.sparse.full_table(module) gathers it (inside model.evaluate a read of weight gathers it)")

    def __getattr__(self, name: str):
        if name == "weight":  # the property refused: nn.Module's own lookup would only say there is no weight
            raise AttributeError(self._not_whole())
        return super().__getattr__(name)

    @abstractmethod
    def _lookup(self, uniq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows (len(uniq), d) for the ascending unique ids ``uniq`` of the call's ``ids``, tracked for
        the backward pass when training."""

    @abstractmethod
    def reduce(self, upto: int | None = None) -> torch.Tensor:
        """Move this step's row gradients (of forwards tagged ``upto`` or earlier); returns this rank's share
        of their squared norm."""

    def held_tensors(self) -> list[torch.Tensor]:
        """The tensors this table holds now: its rows (or shard), their row-optimizer state, and the looked-up rows
        (with their gradients) and reduced gradients that wait for the update (an asynchronous pipeline runs the
        next step's first forwards before this step's update)."""
        rows = [r for _, _, r in self._pending]
        out = [self.table, *self.state.values(), *rows, *(r.grad for r in rows if r.grad is not None)]
        return out + list(self._update or ())

    @property
    def training_step(self) -> bool:
        return torch.is_grad_enabled() and self.training

    def _leaf(self, uniq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Make ``rows`` a leaf whose gradient ``_local_grads`` collects (training only)."""
        if self.training_step:
            rows.requires_grad_(True)
            self._pending.append((self.tag, uniq, rows))
        return rows

    def check_ids(self, ids: torch.Tensor) -> None:
        """IndexError unless every id is a row of the table."""
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise IndexError(f"table '{self.name}' has {self.num_embeddings} rows; got id {bad}")

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        uniq, inv = torch.unique(ids.reshape(-1), return_inverse=True)
        self.check_ids(uniq)
        rows = self._lookup(uniq, ids)
        self.last_rows = uniq.numel()
        if self.bag:
            mode, last = self.bag
            return F.embedding_bag(inv.reshape(ids.shape), rows, offsets, mode=mode,
                                   per_sample_weights=per_sample_weights, include_last_offset=last)
        return F.embedding(inv, rows).reshape(*ids.shape, self.embedding_dim)

    def _local_grads(self, upto: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's unique ids and their summed row gradients over the forwards since the last step (those
        tagged ``upto`` or earlier)."""
        done = [e for e in self._pending if upto is None or e[0] <= upto]
        self._pending = [e for e in self._pending if not (upto is None or e[0] <= upto)]
        pend = [(u, r.grad if r.grad is not None else torch.zeros_like(r)) for _, u, r in done]
        if not pend:
            return (torch.empty(0, dtype=torch.int64, device=self.table.device),
                    self.table.new_empty(0, self.embedding_dim, dtype=self.dtype))
        if len(pend) == 1:
            return pend[0]
        ids, inv = torch.unique(torch.cat([u for u, _ in pend]), return_inverse=True)
        grads = torch.cat([g for _, g in pend])
        return ids, grads.new_zeros(ids.numel(), grads.shape[1]).index_add_(0, inv, grads)

    def _on_wire(self, grads: torch.Tensor) -> torch.Tensor:
        """Row gradients as they cross: in the wire dtype."""
        return grads if self.wire is None else grads.to(self.wire)

    def _combine(self, ids: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
        """Sum rows received for the same id (widened to the table's dtype first), average over ranks as DDP
        does; keep for ``update``."""
        rows, inv = torch.unique(ids, return_inverse=True)
        grads = grads.to(self.dtype)
        total = grads.new_zeros(rows.numel(), grads.shape[1]).index_add_(0, inv, grads).div_(self.world)
        self._update = (rows, total)
        return total.pow(2).sum()

    def update(self, lr: float, scale: float = 1.0) -> None:
        """Apply the row optimizer to the rows reduced by ``reduce`` (gradients times ``scale``)."""
        if self._update is not None:
            rows, grads = self._update
            self.opt.update(self.table, self.state, rows, grads * scale if scale != 1.0 else grads, lr)
            self._update = None

    def own(self, full: torch.Tensor) -> torch.Tensor:
        """The part of a whole-table tensor (weight or per-row state) that this rank holds."""
        return full

    def full(self, part: torch.Tensor) -> torch.Tensor:
        """The whole-table tensor from every rank's ``part`` (the inverse of ``own``; a collective if
        the table is split)."""
        return part

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, strategy={self.strategy}"


class AllGatherTable(RowTable):
    strategy = "allgather"
    sharded = False

    def __init__(self, name: str, source: nn.Module, group, opt: RowOptimizer):
        weight = source.weight
        super().__init__(name, weight.shape[0], weight.shape[1], group, opt, source)
        self.table = weight.detach().clone()
        self.dtype = self.table.dtype
        self.state = opt.init(self.table)

    @property
    def weight(self) -> torch.Tensor:
        return self.table

    def _lookup(self, uniq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self._leaf(uniq, self.table[uniq])

    def reduce(self, upto: int | None = None) -> torch.Tensor:
        """All-gather every rank's unique ids and row gradients; returns the squared norm (same on all)."""
        ids, grads = self._local_grads(upto)
        p = self.world
        if p == 1:
            return self._combine(ids, grads)
        grads = self._on_wire(grads)
        counts = torch.tensor([ids.numel()], dtype=torch.int64, device=ids.device)
        sizes = [int(c) for c in comm.all_gather(counts, "sparse.meta", self.group)]
        all_ids = ids.new_empty(sum(sizes))
        all_grads = grads.new_empty(sum(sizes), self.embedding_dim)
        # An all_to_all that sends the same block to everyone is an all-gather with uneven sizes.
        comm.all_to_all(all_ids, ids.repeat(p), "sparse.allgather", sizes, [ids.numel()] * p, self.group)
        comm.all_to_all(all_grads, grads.repeat(p, 1), "sparse.allgather", sizes, [ids.numel()] * p, self.group)
        return self._combine(all_ids, all_grads)


class PSTable(RowTable):
    """Rows sharded over owners; with ``hosts`` = (local group, host group), traffic is aggregated per host.

    Local aggregation (Parallax): rank j of every host forwards the rows owned by ranks with local index
    j. A pull first collects the host's ids at the forwarders (``ps.local``), each forwarder asks the
    owners once per row for the whole host (``ps.pull``), and hands the rows back. A push sums the host's
    gradients of a row at its forwarder before sending (``ps.push``). So a row crosses a host link once
    per host, however many of the host's workers touched it. Owner rank o sits on host o // L as local
    rank o % L (L workers per host), the layout torchrun gives.
    """

    strategy = "ps"
    sharded = True

    def __init__(self, name: str, source: nn.Module, group, opt: RowOptimizer, plan: RowPlan, hosts=None):
        weight = source.weight
        super().__init__(name, weight.shape[0], weight.shape[1], group, opt, source)
        self.plan, self.me = plan, dist.get_rank(group) if dist.is_initialized() else 0
        self.hosts = hosts  # None, or (local group, host group)
        self.local_size = dist.get_world_size(hosts[0]) if hosts else 1
        self.table = weight.detach()[plan.rows_of(self.me)].clone()
        self.dtype = self.table.dtype
        self.state = opt.init(self.table)

    @property
    def weight(self) -> torch.Tensor:
        return self.whole_weight()

    def own(self, full: torch.Tensor) -> torch.Tensor:
        return full[self.plan.rows_of(self.me)]

    def full(self, part: torch.Tensor) -> torch.Tensor:
        return gather_rows(self, part)

    def _send(self, ids: torch.Tensor, dest: torch.Tensor, group, channel: str, payload: torch.Tensor | None = None):
        """ids (and payload rows) to rank ``dest`` of ``group``; returns what arrived and how to answer it."""
        order = torch.argsort(dest, stable=True)
        splits = _splits(dest, dist.get_world_size(group))
        counts = torch.tensor(splits, dtype=torch.int64, device=ids.device)
        got = torch.empty_like(counts)
        comm.all_to_all(got, counts, "ps.meta", group=group)
        recv_splits = got.tolist()
        rids = ids.new_empty(sum(recv_splits))
        comm.all_to_all(rids, ids[order], channel, recv_splits, splits, group)
        rpay = None
        if payload is not None:
            rpay = payload.new_empty(sum(recv_splits), self.embedding_dim)
            comm.all_to_all(rpay, payload[order].contiguous(), channel, recv_splits, splits, group)
        return rids, rpay, (order, splits, recv_splits, group)

    def _reply(self, rows: torch.Tensor, route, channel: str) -> torch.Tensor:
        """Rows answering the ids that ``_send`` delivered, back in the sender's original order."""
        order, splits, recv_splits, group = route
        back = rows.new_empty(sum(splits), self.embedding_dim)
        comm.all_to_all(back, rows.contiguous(), channel, splits, recv_splits, group)
        out = torch.empty_like(back)
        out[order] = back
        return out

    def _lookup(self, uniq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self._leaf(uniq, self._pull(uniq).to(self.dtype))

    def _rows(self, local: torch.Tensor) -> torch.Tensor:
        """This owner's rows ``local``, in the wire dtype."""
        rows = self.table[local]
        return rows if self.wire is None else rows.to(self.wire)

    def _pull(self, ids: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return self.table[self.plan.local[ids]]
        owner = self.plan.owner
        if not self.hosts:
            wanted, _, route = self._send(ids, owner[ids], self.group, "ps.pull")
            return self._reply(self._rows(self.plan.local[wanted]), route, "ps.pull")
        local, host, L = *self.hosts, self.local_size
        at_fwd, _, route1 = self._send(ids, owner[ids] % L, local, "ps.local")
        host_ids, inv = torch.unique(at_fwd, return_inverse=True)  # the host's union, once per row
        wanted, _, route2 = self._send(host_ids, owner[host_ids] // L, host, "ps.pull")
        rows = self._reply(self._rows(self.plan.local[wanted]), route2, "ps.pull")
        return self._reply(rows[inv], route1, "ps.local")

    def reduce(self, upto: int | None = None) -> torch.Tensor:
        """Push row gradients to their owners; returns the squared norm of this owner's share."""
        ids, grads = self._local_grads(upto)
        if self.world == 1:
            return self._combine(self.plan.local[ids], grads)
        owner = self.plan.owner
        if self.hosts:
            local, host, L = *self.hosts, self.local_size
            at_fwd, g, _ = self._send(ids, owner[ids] % L, local, "ps.local", self._on_wire(grads))
            ids, inv = torch.unique(at_fwd, return_inverse=True)
            g = g.to(self.dtype)  # the host's sum in the table's dtype, rounded once more to cross
            grads = g.new_zeros(ids.numel(), self.embedding_dim).index_add_(0, inv, g)  # local aggregation
            got_ids, got, _ = self._send(ids, owner[ids] // L, host, "ps.push", self._on_wire(grads))
        else:
            got_ids, got, _ = self._send(ids, owner[ids], self.group, "ps.push", self._on_wire(grads))
        return self._combine(self.plan.local[got_ids], got)


def gather_rows(module: RowTable, part: torch.Tensor) -> torch.Tensor:
    """The whole per-row tensor of a table split by rows (``module.plan``), from every owner's ``part``."""
    counts = module.plan.counts
    pad = part.new_zeros(max(counts), *part.shape[1:])
    pad[: part.shape[0]] = part
    parts = comm.all_gather(pad, "ps.gather", module.group)
    out = part.new_empty(module.num_embeddings, *part.shape[1:])
    for r, got in enumerate(parts):
        out[module.plan.rows_of(r)] = got[: counts[r]]
    return out


def full_table(module: RowTable, shard: torch.Tensor | None = None) -> torch.Tensor:
    """The whole table of a ``ps``, ``alltoall`` or ``allgather`` module on every rank (a collective
    unless replicated).

    ``shard``: gather this per-row tensor shaped like the module's own rows instead (optimizer state).
    """
    shard = module.table if shard is None else shard
    return shard if module.world == 1 else module.full(shard)


def table_state(module: RowTable) -> dict[str, torch.Tensor]:
    """Whole-table weight and row-optimizer state, as a single process would hold them."""
    out = {"weight": full_table(module)}
    for k, v in module.state.items():
        out[f"row.{k}"] = full_table(module, v) if v.dim() else v.clone()
    return out


@torch.no_grad()
def load_table_state(module: RowTable, state: dict[str, torch.Tensor]) -> None:
    """Take this rank's rows of a :func:`table_state` (whatever strategy or rank count saved it)."""
    module.table.copy_(module.own(state["weight"]))
    for k, v in module.state.items():
        v.copy_(module.own(state[f"row.{k}"]) if v.dim() else state[f"row.{k}"])


def push_fused(tables: list[PSTable], upto: int | None = None) -> list[torch.Tensor]:
    """``reduce`` of several flat ``ps`` tables of one group in three all_to_alls instead of three each.

    On hosts with a fraction of a core, each collective costs a scheduling round on every host, so a
    step's pushes go together: one exchange of per-(destination, table) row counts, one of ids, one of
    gradient values (rows of different widths flattened). Bytes are those of separate pushes, except
    that the counts travel as one [P, T] block. Returns each table's squared-norm share.
    """
    first = tables[0]
    p, t_count, group = first.world, len(tables), first.group
    grads_by_table = [t._local_grads(upto) for t in tables]
    counts = torch.zeros(p, t_count, dtype=torch.int64, device=first.table.device)
    ids_blocks, val_blocks = [[] for _ in range(p)], [[] for _ in range(p)]
    for j, (t, (ids, grads)) in enumerate(zip(tables, grads_by_table)):
        dest = t.plan.owner[ids]
        order = torch.argsort(dest, stable=True)
        n = torch.bincount(dest, minlength=p)
        counts[:, j] = n
        for r, (i, g) in enumerate(zip(ids[order].split(n.tolist()), t._on_wire(grads)[order].split(n.tolist()))):
            ids_blocks[r].append(i)
            val_blocks[r].append(g.reshape(-1))
    got = torch.empty_like(counts)
    comm.all_to_all(got, counts, "ps.meta", group=group)
    dims = torch.tensor([t.embedding_dim for t in tables], device=got.device)
    send_ids = torch.cat([torch.cat(b) for b in ids_blocks])
    send_vals = torch.cat([torch.cat(b) for b in val_blocks])
    recv_ids = send_ids.new_empty(int(got.sum()))
    comm.all_to_all(recv_ids, send_ids, "ps.push", got.sum(1).tolist(), counts.sum(1).tolist(), group)
    recv_vals = send_vals.new_empty(int((got * dims).sum()))
    comm.all_to_all(recv_vals, send_vals, "ps.push", (got * dims).sum(1).tolist(), (counts * dims).sum(1).tolist(),
                    group)
    per_ids, per_vals = [[] for _ in tables], [[] for _ in tables]
    id_parts = recv_ids.split(got.reshape(-1).tolist())
    val_parts = recv_vals.split((got * dims).reshape(-1).tolist())
    for k, (i, v) in enumerate(zip(id_parts, val_parts)):  # source-major, then table
        j = k % t_count
        per_ids[j].append(i)
        per_vals[j].append(v.reshape(-1, tables[j].embedding_dim))
    return [t._combine(t.plan.local[torch.cat(i)], torch.cat(v)) for t, i, v in zip(tables, per_ids, per_vals)]
