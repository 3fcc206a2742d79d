"""Find a model's sparse tables and measure how sparsely a step touches them.

A table is an ``nn.Embedding`` or ``nn.EmbeddingBag``: layers that read rows by id, so a step's gradient
is zero outside the rows it read (this includes the sampled-softmax output weights of the LSTM LM, which
are looked up by id). A table whose weight is shared with another layer (tied input/output embeddings
under a full softmax) gets a gradient in every row and is not sparse. The fraction of rows a step
touches is measured by running the model on sample batches with hooks on the tables.

    >>> from tessel.models import LSTMLM
    >>> m = LSTMLM(vocab_size=1000, dim=16, hidden=32, softmax="sampled", num_sampled=20)
    >>> [t.name for t in find_tables(m)]
    ['embedding', 'head.weight', 'head.bias']
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ..data.prepared import batch_tensors, call
from ..errors import PlanError

TABLE_TYPES = (nn.Embedding, nn.EmbeddingBag)


@dataclass
class TableInfo:
    name: str  # module name inside the model
    rows: int
    dim: int
    bytes: int
    shared_with: list[str] = field(default_factory=list)  # other modules holding the same weight
    touched: float = 0.0  # mean fraction of rows one rank's batch reads
    unique_per_step: float = 0.0  # mean unique ids one rank's batch reads
    lookups_per_step: float = 0.0
    fed: bool = False  # the table reads the batch's first argument as its ids (so they are known ahead)
    # The batch tensor the table's ids begin with (0: the first argument, 1: the second, a language model's
    # targets), so those ids are known a step ahead; ``more``: the forward adds ids of its own after them (a sampled
    # softmax's candidates, drawn when it runs). None: the ids are not the batch's.
    ahead: int | None = None
    more: bool = False
    # The table looked up just before with the very same ids tensor, in every sample batch (a sampled softmax's bias
    # after its weight): under alltoall split by columns that table's route serves this one too, and no ids cross.
    route_from: str | None = None
    counts: list[torch.Tensor] = field(default_factory=list, repr=False)  # per sample batch: accesses per row
    unsupported: str | None = None  # why it cannot be served row by row (see ``unsupported``)

    def restrict(self, lo: int, n: int) -> TableInfo:
        """This table's rows lo..lo+n-1 as a table of their own (a tensor-parallel shard's part of it); the ids
        it sees are no longer the batch's, so nothing is prefetched for it."""
        counts = [c[lo:lo + n] for c in self.counts]
        uniq = sum(float((c > 0).sum()) for c in counts) / max(len(counts), 1)
        return dataclasses.replace(
            self, rows=n, bytes=self.bytes * n // self.rows, counts=counts, unique_per_step=uniq, touched=uniq / n,
            lookups_per_step=sum(float(c.sum()) for c in counts) / max(len(counts), 1), fed=False, ahead=None,
            more=False, route_from=None)


def find_tables(model: nn.Module) -> list[TableInfo]:
    """Every embedding-like table of ``model``, with what else shares its weight."""
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(name)
    tables = []
    for name, module in model.named_modules():
        if isinstance(module, TABLE_TYPES):
            w = module.weight
            tables.append(TableInfo(name, w.shape[0], w.shape[1], w.numel() * w.element_size(),
                                    [o for o in owners[id(w)] if o != name], unsupported=unsupported(module)))
    return tables


def unsupported(module: nn.Module) -> str | None:
    """Why ``module`` cannot be served row by row, or None."""
    if getattr(module, "padding_idx", None) is not None:
        return "padding_idx is set"
    if getattr(module, "max_norm", None) is not None:
        return "max_norm is set (it renormalises rows in the forward pass)"
    if getattr(module, "scale_grad_by_freq", False):
        return "scale_grad_by_freq is set"
    return None


@torch.no_grad()
def measure(model: nn.Module, tables: list[TableInfo], batches: list, run=None) -> float:
    """Fill ``touched``, ``unique_per_step``, ``counts`` and ``fed`` of ``tables`` from forward passes over
    ``batches``, each run as its loop runs it (``run(model, batch)``; default :func:`tessel.data.prepared.call`:
    ``model(**batch)`` for a dict, ``model(*batch)`` for a tuple); the tables' own inputs are read by hooks.
    Returns the mean seconds of one forward pass.

    The global RNG is restored afterwards, so layers that draw random numbers in the forward pass (the
    sampled softmax) draw in training exactly what they would have drawn without this measurement.
    """
    if not batches:
        raise PlanError("measuring table sparsity needs at least one sample batch")
    run = run or call
    modules = dict(model.named_modules())
    seen: dict[str, list[list[torch.Tensor]]] = {t.name: [] for t in tables}
    given: dict[str, list[list[torch.Tensor]]] = {t.name: [] for t in tables}  # the ids tensors themselves

    def hook(name):
        def note(m, args):
            seen[name][-1].append(args[0].reshape(-1))
            given[name][-1].append(args[0])
        return note

    hooks = [modules[t.name].register_forward_pre_hook(hook(t.name)) for t in tables]
    was_training = model.training
    t0 = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=[]):
            model.train()
            for batch in batches:
                for t in tables:
                    seen[t.name].append([])
                    given[t.name].append([])
                run(model, batch)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    seconds = (time.perf_counter() - t0) / len(batches)
    for t in tables:
        per_batch = []
        for ids in seen[t.name]:
            c = torch.zeros(t.rows, dtype=torch.float64)
            for x in ids:
                c.index_add_(0, x.cpu(), torch.ones(x.numel(), dtype=torch.float64))
            per_batch.append(c)
        # Prefetching the next step's rows needs ids known before the forward pass: the batch's own tensors.
        t.ahead, t.more = _feed(seen[t.name], batches)
        t.fed = t.ahead == 0 and not t.more
        t.counts = per_batch
        t.unique_per_step = sum(float((c > 0).sum()) for c in per_batch) / len(per_batch)
        t.lookups_per_step = sum(float(c.sum()) for c in per_batch) / len(per_batch)
        t.touched = t.unique_per_step / t.rows
    for k, t in enumerate(tables):
        t.route_from = next((a.name for a in tables[:k] if _same_ids(given[a.name], given[t.name])), None)
    return seconds


def _same_ids(first: list[list[torch.Tensor]], then: list[list[torch.Tensor]]) -> bool:
    """Every sample batch's lookups of two tables read the very same ids tensors, one by one."""
    return all(len(a) == len(b) > 0 and all(x is y for x, y in zip(a, b)) for a, b in zip(first, then))


def _feed(seen: list[list[torch.Tensor]], batches: list) -> tuple[int | None, bool]:
    """(k, more): every sample batch's one lookup of a table began with the batch's k-th tensor
    (:func:`tessel.data.prepared.batch_tensors`), and ``more``: some lookup read ids after it. (None, False) if no
    k fits all."""
    fits = None
    for ids, b in zip(seen, batches):
        if len(ids) != 1:
            return None, False
        got = ids[0]
        here = {k: got.numel() > x.numel() for k, x in enumerate(batch_tensors(b))
                if x.dtype == got.dtype and got.numel() >= x.numel() and torch.equal(got[: x.numel()], x.reshape(-1))}
        fits = here if fits is None else {k: fits[k] or more for k, more in here.items() if k in fits}
    if not fits:
        return None, False
    k = min(fits)  # the first argument when both fit (a batch whose targets equal its inputs)
    return k, fits[k]
