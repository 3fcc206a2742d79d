"""``alltoall``: a table split over the dp ranks inside data-parallel training (EmbRace, TorchRec-style).

- *column* split (default): rank j holds the columns [c_j, c_j + s_j) of every row. Every rank's unique
  ids go to every owner; each owner answers its slice of each row. Work and bytes are the same on every
  owner however skewed the ids are (a hot row is served by all owners, 1/N of it each).
- *row* split: rank j holds the rows the partition plan (:mod:`tessel.sparse.partition`) gives it; an
  id goes to its one owner. Ids cost 1/N of the column split's, but the busiest owner serves the hot
  rows. Row wins when the rows are narrow (d·b/N close to the 8 bytes of an id) or N exceeds d.

Forward: ids to owners (``a2a.meta`` counts, ``a2a.ids``), owners' parts of the rows back
(``a2a.fwd``). Backward: each row's gradient goes back along the same route (``a2a.bwd``, no ids resent)
and the owner sums it over ranks and updates its part with the row optimizer. Nothing else moves: the
table's gradient is never synchronised. Scheduling (``schedule=True``): see :mod:`tessel.sparse.schedule`.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .. import comm
from ..errors import PlanError
from .partition import RowPlan
from .rowopt import RowOptimizer
from .schedule import Clock, priority
from .tables import RowTable, gather_rows


def _timed(method):
    """Count ``method``'s time as the table's (its waits are told apart by the clock; the rest is its work)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.clock.inside():
            return method(self, *args, **kwargs)
    return call


@dataclass
class Route:
    """Who asked whom for which rows in one lookup; both ends know it after the id exchange."""

    uniq: torch.Tensor  # this rank's unique ids, ascending
    ids_in: torch.Tensor  # ids this rank serves, requester by requester
    n_in: list[int]  # rows each requester asked of this rank
    n_out: list[int]  # rows this rank asked of each owner
    order: torch.Tensor | None = None  # row split: positions of ``uniq`` sorted by owner


@dataclass
class Fetch:
    """Rows of one lookup in flight: pieces arriving from the owners, possibly in two priority phases."""

    route: Route
    rows: torch.Tensor  # (k, d), filled as phases are assembled
    phases: list = field(default_factory=list)  # (work, recv buffer, mask over uniq or None)


@dataclass
class Lookup:
    """One forward's rows, waiting for their gradient to go back to the owners."""

    route: Route
    rows: torch.Tensor  # the leaf the forward used, (k, d)
    tag: int  # the mini-batch it belongs to (see ``RowTable.tag``)
    # (work, receive buffer) once a hook sent the gradient early. A one-slot box the hook fills: the hook lives
    # in ``rows``' autograd metadata (C++), where the garbage collector cannot see it, so the hook must not hold
    # ``rows`` (or anything holding it) or every step's rows and buffers stay alive for good.
    sent: list = field(default_factory=lambda: [None])


def _row_route(col: Route, plan: RowPlan, me: int, world: int) -> Route:
    """A row split's route for the ids a column split's ``col`` was taken for, without an exchange: under a column
    split every owner received every rank's unique ids, so each rank knows which of them it serves by rows (in the
    order a requester sends them: its ids by owner, ascending) and which owner serves each of its own."""
    mine = [u[plan.owner[u] == me] for u in col.ids_in.split(col.n_in)]
    dest = plan.owner[col.uniq]
    order = torch.argsort(dest, stable=True)
    return Route(col.uniq, torch.cat(mine), [m.numel() for m in mine],
                 torch.bincount(dest, minlength=world).tolist(), order)


class AllToAllTable(RowTable):
    strategy = "alltoall"
    sharded = True

    def __init__(self, name: str, source: nn.Module, group, opt: RowOptimizer, split: str = "column",
                 plan: RowPlan | None = None, schedule: bool = False, lookahead: bool = False,
                 clock: Clock | None = None, routes: dict | None = None, feed: int = 0, more: bool = False):
        weight = source.weight
        super().__init__(name, weight.shape[0], weight.shape[1], group, opt, source)
        p, d = self.world, weight.shape[1]
        self.me = dist.get_rank(group) if dist.is_initialized() else 0
        self.split, self.plan, self.schedule = split, plan, schedule
        if split == "column":
            if d < p:
                raise PlanError(f"table '{name}' has {d} columns, fewer than {p} ranks: a column split leaves ranks "
                                "empty; use --sparse.split auto (rows for tables this narrow) or row")
            self.widths = [d // p + (r < d % p) for r in range(p)]
            c0 = sum(self.widths[: self.me])
            self.cols = (c0, c0 + self.widths[self.me])
            self.table = weight.detach()[:, c0: self.cols[1]].clone()
        else:
            self.widths = [d] * p
            self.table = weight.detach()[plan.rows_of(self.me)].clone()
        # Prefetching the next batch needs every rank to know which rows this step touches: only the
        # column split, where every owner sees every id, has that for free.
        self.lookahead = bool(lookahead and schedule and split == "column")
        # The batch tensor whose ids are prefetched (``SparseTables.begin_step``), and whether the forward reads
        # more ids after them (a sampled softmax's candidates): those it fetches when it runs.
        self.feed, self.more = feed, more
        self.dtype = self.table.dtype
        self.state = opt.init(self.table)
        self.clock = clock or Clock()
        # Tables looked up with the very same ids tensor (a sampled softmax's weight and bias) share one route if
        # split alike, and a row split's is derived from a column split's: the ids cross the wire once.
        self.routes = routes if routes is not None else {}
        self.final = True  # the engine clears it before all but the last micro-batch's backward
        self._lookups: list[Lookup] = []
        self._ready: Fetch | None = None  # this step's rows, fetched ahead
        self._next: Fetch | None = None  # the next step's rows, being fetched
        self._asked = None  # the next step's raw ids in flight: (work, buffer)
        # Rows this step touches, bool per row, from the prefetch until the next step's late phase is sent; it grows
        # while this step's forwards read ids not prefetched (``more``)
        self._touched: torch.Tensor | None = None
        self._leaf: tuple[Route, torch.Tensor] | None = None  # this step's prefetched rows, once assembled

    def held_tensors(self) -> list[torch.Tensor]:
        """As a row table's, with the lookups waiting for their gradients' exchange and the rows fetched ahead
        (this step's and the next one's, which a scheduled table holds across the step's end)."""
        rows = [e.rows for e in self._lookups] + [f.rows for f in (self._ready, self._next) if f is not None]
        out = [*super().held_tensors(), *rows, *(r.grad for r in rows if r.grad is not None)]
        return out + ([self._leaf[1]] if self._leaf is not None else [])

    @property
    def weight(self) -> torch.Tensor:
        return self.whole_weight()

    def own(self, full: torch.Tensor) -> torch.Tensor:
        if self.split == "column":
            return full[:, self.cols[0]: self.cols[1]]
        return full[self.plan.rows_of(self.me)]

    def full(self, part: torch.Tensor) -> torch.Tensor:
        if self.split == "row":
            return gather_rows(self, part)
        pad = part.new_zeros(part.shape[0], max(self.widths))
        pad[:, : part.shape[1]] = part
        pieces = comm.all_gather(pad, "a2a.gather", self.group)
        return torch.cat([x[:, :w] for x, w in zip(pieces, self.widths)], dim=1)

    def _local(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.split == "column" else self.plan.local[ids]

    # -- the three exchanges ------------------------------------------------------------------------

    def _ask(self, uniq: torch.Tensor) -> Route:
        """Send this rank's unique ids to their owners (blocking: two small collectives)."""
        p, g, k = self.world, self.group, uniq.numel()
        if self.split == "column":
            n_in = [int(c) for c in comm.all_gather(torch.tensor([k], device=uniq.device), "a2a.meta", g)]
            ids_in = uniq.new_empty(sum(n_in))
            comm.all_to_all(ids_in, uniq.repeat(p), "a2a.ids", n_in, [k] * p, g)
            return Route(uniq, ids_in, n_in, [k] * p)
        dest = self.plan.owner[uniq]
        order = torch.argsort(dest, stable=True)
        n_out = torch.bincount(dest, minlength=p)
        got = torch.empty_like(n_out)
        comm.all_to_all(got, n_out, "a2a.meta", group=g)
        n_in = got.tolist()
        ids_in = uniq.new_empty(sum(n_in))
        comm.all_to_all(ids_in, uniq[order], "a2a.ids", n_in, n_out.tolist(), g)
        return Route(uniq, ids_in, n_in, n_out.tolist(), order)

    def _serve(self, route: Route, fetch: Fetch, mask_in=None, mask_out=None, async_op: bool = False,
               what: str = "rows") -> None:
        """Answer the ids of ``route`` (those in ``mask_in``) with this rank's part of each row; a wait for them
        counts as ``what`` ("late_rows": the ones that could only travel after the owner's update)."""
        w_me = self.widths[self.me]
        ids, n_in = route.ids_in, route.n_in
        if mask_in is not None:
            ids = ids[mask_in]
            n_in = [int(m.sum()) for m in mask_in.split(route.n_in)]
        vals = self.table[self._local(ids)].reshape(-1)
        vals = vals if self.wire is None else vals.to(self.wire)  # rows cross in the wire dtype (mixed precision)
        if self.split == "column":
            count = route.uniq.numel() if mask_out is None else int(mask_out.sum())
            n_out = [count] * self.world
        else:
            sorted_mask = None if mask_out is None else mask_out[route.order]
            n_out = route.n_out if sorted_mask is None else [int(m.sum()) for m in sorted_mask.split(route.n_out)]
        out_splits = [n * w for n, w in zip(n_out, self.widths)]
        buf = vals.new_empty(sum(out_splits))
        call = lambda: comm.all_to_all(buf, vals, "a2a.fwd", out_splits, [n * w_me for n in n_in], self.group,
                                       async_op=async_op)
        work = self.clock.launch(call()) if async_op else self.clock.sync(call, "rows")
        fetch.phases.append((work, buf, mask_out, n_out, what))

    def _assemble(self, fetch: Fetch) -> torch.Tensor:
        """Wait for the phases of ``fetch`` and place their pieces into ``fetch.rows``."""
        route = fetch.route
        for work, buf, mask, n_out, what in fetch.phases:
            if work is not None:
                self.clock.wait(work, what)
            pieces = buf.split([n * w for n, w in zip(n_out, self.widths)])
            if self.split == "column":
                part = torch.cat([x.view(n_out[0], w) for x, w in zip(pieces, self.widths)], dim=1)
                if mask is None:
                    fetch.rows.copy_(part)
                else:
                    fetch.rows[mask] = part.to(fetch.rows.dtype)  # rows cross in the wire dtype, kept in the table's
            else:
                pos = route.order if mask is None else route.order[mask[route.order]]
                fetch.rows[pos] = torch.cat([x.view(-1, self.embedding_dim) for x in pieces]).to(fetch.rows.dtype)
        fetch.phases = []
        return fetch.rows

    def _send_grads(self, route: Route, grad: torch.Tensor, async_op: bool):
        """Row gradients back to the owners along ``route``; returns (work or None, receive buffer)."""
        w_me, grad = self.widths[self.me], self._on_wire(grad)
        if self.split == "column":
            c = [0]
            for w in self.widths:
                c.append(c[-1] + w)
            send = torch.cat([grad[:, a:b].reshape(-1) for a, b in zip(c, c[1:])])
            out_splits = [route.uniq.numel() * w for w in self.widths]
        else:
            send = grad[route.order].reshape(-1)
            out_splits = [n * self.embedding_dim for n in route.n_out]
        buf = grad.new_empty(sum(route.n_in) * w_me)
        call = lambda: comm.all_to_all(buf, send, "a2a.bwd", [n * w_me for n in route.n_in], out_splits, self.group,
                                       async_op=async_op)
        return (self.clock.launch(call()) if async_op else self.clock.sync(call, "grads")), buf

    # -- lookahead (across iterations) --------------------------------------------------------------

    @_timed
    def prefetch(self, ids_now: torch.Tensor | None, ids_next: torch.Tensor | None) -> None:
        """At the start of a step: make sure this step's rows are coming, and start the next step's.

        ``ids_now``/``ids_next``: this and the next step's whole input ids (all micro-batches)."""
        if not self.lookahead or not self.training_step:
            return
        self.launch_next()  # in case no backward pass came between (a loop without the engine)
        # A further forward before this step's update (a user's loop accumulating gradients over forwards): the
        # earlier forwards' rows stay tracked for the step's reduce, and this one gets rows of its own.
        further = self._leaf is not None
        self._leaf = None
        if self._next is not None:
            if further:  # no update comes between: the rows this step touched are final now, not after it
                self._send_late(self._next)
            self._ready, self._next = self._next, None
        elif ids_now is not None:
            uniq = torch.unique(ids_now.reshape(-1))
            self.check_ids(uniq)
            route = self.clock.sync(lambda: self._ask(uniq), "ids")
            self._ready = Fetch(route, self.table.new_empty(uniq.numel(), self.embedding_dim))
            self._serve(route, self._ready, async_op=True)
        if ids_next is None or self._ready is None:
            return
        if self._touched is None:  # else a further forward of this step: the earlier ones' rows stay touched
            self._touched = torch.zeros(self.num_embeddings, dtype=torch.bool, device=self.table.device)
        self._touched[self._ready.route.ids_in] = True  # column split: every rank's ids of this step
        # The next ids travel raw and in the background (every rank's batch has the same shape); the
        # owners deduplicate them once they are in, before this step's backward pass (launch_next).
        raw = ids_next.reshape(-1).to(torch.int32 if self.num_embeddings < 2**31 else torch.int64)
        buf = raw.new_empty(self.world * raw.numel())
        work = self.clock.launch(comm.all_gather_into(buf, raw, "a2a.ids", self.group, async_op=True))
        self._asked = (work, buf)

    @_timed
    def launch_next(self) -> None:
        """Turn the next step's ids into a route and send the rows that are final already (early phase). A table
        whose forwards read ids of their own (``more``) waits for the step's last: only then is it known which rows
        this step touches."""
        if self._asked is None or (self.more and not self.final):
            return
        work, buf = self._asked
        self._asked = None
        self.clock.wait(work, "ids")
        self.check_ids(buf)
        uniqs = [torch.unique(x).long() for x in buf.view(self.world, -1)]
        uniq = uniqs[self.me]
        route = Route(uniq, torch.cat(uniqs), [u.numel() for u in uniqs], [uniq.numel()] * self.world)
        early_in, _ = priority(route.ids_in, self._touched)
        early_out, _ = priority(uniq, self._touched)
        self._next = Fetch(route, self.table.new_empty(uniq.numel(), self.embedding_dim))
        self._serve(route, self._next, early_in, early_out, async_op=True)

    # -- forward, backward, update ------------------------------------------------------------------

    @_timed
    def _lookup(self, uniq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.training_step and (self._ready is not None or self._leaf is not None):
            return self._prefetched(uniq)
        key = (self.split, id(self.plan))  # a column split has no owner map: its key is ("column", id(None))
        route = self._known(key, ids)
        if route is None and self.split == "row" and (col := self._known(("column", id(None)), ids)) is not None:
            route = _row_route(col, self.plan, self.me, self.world)  # every rank's ids are in it: none cross
        if route is None:
            route = self.clock.sync(lambda: self._ask(uniq), "ids")
        self.routes[key] = (weakref.ref(ids), route)
        return self._fetch(route)

    def _known(self, key: tuple, ids: torch.Tensor) -> Route | None:
        """The route another table of this group took for this very ``ids`` tensor, split as ``key`` says."""
        last = self.routes.get(key)
        return last[1] if last is not None and last[0]() is ids else None

    def _fetch(self, route: Route) -> torch.Tensor:
        """The rows of ``route``'s ids, asked now and waited for (tracked for their gradient when training)."""
        fetch = Fetch(route, self.table.new_empty(route.uniq.numel(), self.embedding_dim))
        self._serve(route, fetch)
        rows = self._assemble(fetch)
        if self.training_step:
            rows.requires_grad_(True)
            self._track(route, rows, whole_step=False)
            if self._touched is not None:
                self._touched[route.ids_in] = True  # the next step's rows that must wait for this update
        return rows

    def _prefetched(self, uniq: torch.Tensor) -> torch.Tensor:
        """This micro-batch's rows out of the step's prefetched rows (one leaf for the whole step)."""
        if self._leaf is None:
            rows = self._assemble(self._ready).requires_grad_(True)
            self._leaf = (self._ready.route, rows)
            self._ready = None
            self._track(self._leaf[0], rows, whole_step=True)
        route, rows = self._leaf
        n = route.uniq.numel()
        pos = torch.searchsorted(route.uniq, uniq).clamp_(max=max(n - 1, 0))
        found = route.uniq[pos] == uniq if n else torch.zeros_like(uniq, dtype=torch.bool)
        if not self.more:
            if not bool(found.all()):
                raise PlanError(f"table '{self.name}' was prefetched for this step's input ids, but the forward "
                                "pass asked for others; pass the batch's inputs to begin_step")
            return rows[pos]
        # The ids past the batch's (a sampled softmax's candidates) are fetched now, by every rank (the exchange is
        # collective, so a rank with none still takes part); a row comes from the prefetched leaf or from these.
        miss = uniq[~found]
        extra = self._fetch(self.clock.sync(lambda: self._ask(miss), "ids"))
        at = torch.where(found, pos, n + torch.cumsum(~found, 0) - 1)
        return torch.cat([rows, extra])[at]

    def _track(self, route: Route, rows: torch.Tensor, whole_step: bool) -> None:
        entry = Lookup(route, rows, self.tag)
        self._lookups.append(entry)
        if self.schedule:
            def hook(t, sent=entry.sent):  # ``t`` is ``rows``; see Lookup.sent for why it is not captured
                # A step's prefetched rows collect every micro-batch's gradient: send after the last.
                if sent[0] is None and (self.final or not whole_step):
                    with self.clock.inside():
                        sent[0] = self._send_grads(route, t.grad, async_op=True)
            rows.register_post_accumulate_grad_hook(hook)

    @_timed
    def reduce(self, upto: int | None = None) -> torch.Tensor:
        """Finish the gradient exchanges (of lookups tagged ``upto`` or earlier); returns the squared norm of
        this owner's part."""
        got_ids, got = [], []
        w_me = self.widths[self.me]
        done = [e for e in self._lookups if upto is None or e.tag <= upto]
        later = [e for e in self._lookups if not (upto is None or e.tag <= upto)]
        for e in done:
            sent = e.sent[0]
            if sent is None:
                grad = e.rows.grad if e.rows.grad is not None else torch.zeros_like(e.rows)
                sent = self._send_grads(e.route, grad, async_op=False)
            work, buf = sent
            if work is not None:
                self.clock.wait(work, "grads")
            got_ids.append(self._local(e.route.ids_in))
            got.append(buf.view(-1, w_me))
        self._lookups, self._leaf = later, None
        if not got:
            return self._combine(torch.empty(0, dtype=torch.int64, device=self.table.device),
                                 self.table.new_empty(0, w_me))
        return self._combine(torch.cat(got_ids), torch.cat(got))

    @_timed
    def update(self, lr: float, scale: float = 1.0) -> None:
        """Apply the row update, then send the next step's rows that waited for it (the late phase)."""
        super().update(lr, scale)
        self.launch_next()
        if self._next is not None:
            self._send_late(self._next)
        self._touched = None

    def _send_late(self, nxt: Fetch) -> None:
        """Send the rows of ``nxt`` this step touched (final once updated, or with no update to come before the
        forward that reads them). Were one of them sent early and touched after (a forward's own ids read after
        the early phase), it is sent again here and the later copy is the one kept."""
        touched = self._touched
        if touched is not None:
            self._serve(nxt.route, nxt, touched[nxt.route.ids_in], touched[nxt.route.uniq], async_op=True,
                        what="late_rows")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, split={self.split}, schedule={self.schedule}, lookahead={self.lookahead}"
