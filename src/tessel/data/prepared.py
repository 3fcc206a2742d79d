"""A user's loader, sliced over the data-parallel ranks, one batch peeked ahead, with a resumable position.

``tessel.prepare`` wraps the user's loader in a :class:`PreparedLoader`: each rank gets its contiguous
slice of every global batch (so a mean loss over the slice, averaged over the ranks, is the global batch's
mean), and the model can start the next batch's table rows on their way before the step that uses them.

    >>> import torch
    >>> loader = PreparedLoader([torch.arange(8), torch.arange(8, 16)], rank=1, size=2)
    >>> [t.tolist() for t in loader]
    [[4, 5, 6, 7], [12, 13, 14, 15]]
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from ..errors import TesselError


def _parts(batch: Any) -> list:
    """The tensors of a batch as a user's loader yields it: a tensor, a tuple/list of them, or a dict of them (the
    Hugging Face convention: ``input_ids``, ``attention_mask``, ``labels``)."""
    if isinstance(batch, dict):
        return list(batch.values())
    return list(batch) if isinstance(batch, (tuple, list)) else [batch]


def slice_batch(batch: Any, rank: int, size: int) -> Any:
    """This rank's contiguous part of a global batch: a tensor, a tuple/list or a dict of tensors, batch first.

    >>> slice_batch({"input_ids": torch.arange(4).view(2, 2), "labels": torch.arange(4).view(2, 2)}, 1, 2)
    {'input_ids': tensor([[2, 3]]), 'labels': tensor([[2, 3]])}
    """
    parts = _parts(batch)
    if not parts or not all(torch.is_tensor(t) and t.dim() >= 1 for t in parts):
        kinds = ", ".join(type(t).__name__ for t in parts) or "nothing"
        raise TesselError(f"the loader yields {type(batch).__name__} of {kinds}; prepare shards a tensor, a "
                          "tuple/list or a dict of tensors with the batch as their first dimension")
    n = parts[0].shape[0]
    if any(t.shape[0] != n for t in parts) or n % size:
        raise TesselError(f"a batch of sizes {[t.shape[0] for t in parts]} cannot be split over {size} ranks; "
                          f"every tensor of a batch needs the same first dimension, a multiple of {size}")
    k = n // size
    if isinstance(batch, dict):
        return type(batch)((key, t[rank * k:(rank + 1) * k]) for key, t in batch.items())
    mine = [t[rank * k:(rank + 1) * k] for t in parts]
    return mine[0] if torch.is_tensor(batch) else type(batch)(mine)


def first_tensor(batch):
    """The batch's ids: a dict's ``input_ids`` (else its first tensor), a tuple's first tensor, or the tensor."""
    if batch is None or torch.is_tensor(batch):
        return batch
    if isinstance(batch, dict):
        return batch["input_ids"] if "input_ids" in batch else next(iter(batch.values()))
    return batch[0]


def batch_tensors(batch) -> tuple:
    """The batch's tensors in order, as a table's ids are matched against them (``TableInfo.ahead``): a tuple's or
    list's tensors, a dict's or a tensor's ids alone (:func:`first_tensor`); () for None."""
    if batch is None:
        return ()
    if isinstance(batch, (tuple, list)):
        return tuple(x for x in batch if torch.is_tensor(x))
    return (first_tensor(batch),)


def call(model, batch):
    """The model run on a batch the way its loop does: ``model(**batch)`` for a dict, ``model(*batch)`` for a
    tuple or list, ``model(batch)`` for a tensor."""
    if isinstance(batch, dict):
        return model(**batch)
    return model(*batch) if isinstance(batch, (tuple, list)) else model(batch)


_first = first_tensor


class PreparedLoader:
    """This rank's slices of the user's loader's batches, one batch peeked ahead (the model prefetches its
    rows), with a resumable position: ``state_dict()['position']`` batches of the current pass are skipped
    by the next ``iter()`` after ``load_state_dict`` (the user's loader must repeat its order)."""

    def __init__(self, loader, rank: int, size: int) -> None:
        self.loader, self.rank, self.size = loader, rank, size
        self.position, self.skip, self.steps = 0, 0, 0  # batches of this pass, to skip, of all passes
        self.current = self.next_inputs = None  # first tensors of the batch just yielded and of the next one
        self.batch = self.upcoming = None  # the batch just yielded and the next one (this rank's slices)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        for _ in range(self.skip):
            next(it, None)
        self.position, self.skip = self.skip, 0
        ahead = next(it, None)
        while ahead is not None:
            batch, ahead = slice_batch(ahead, self.rank, self.size), next(it, None)
            nxt = None if ahead is None else slice_batch(ahead, self.rank, self.size)
            self.current, self.next_inputs = _first(batch), _first(nxt)
            self.batch, self.upcoming = batch, nxt
            self.position += 1
            self.steps += 1
            yield batch
        self.position = 0  # the pass is over: a checkpoint taken now resumes at the next pass's start

    def sliced(self, loader) -> PreparedLoader:
        """Another loader of the user's (held-out batches), sliced over the ranks as this one is.

        >>> held = PreparedLoader([], rank=1, size=2).sliced([torch.arange(4)])
        >>> [t.tolist() for t in held]
        [[2, 3]]
        """
        return PreparedLoader(loader, self.rank, self.size)

    def samples(self, k: int) -> list:
        """This rank's slices of the first ``k`` batches, as the loader yields them (see :func:`call`; the global
        RNG is kept: a shuffling DataLoader draws its order from it)."""
        with torch.random.fork_rng(devices=[]):
            got = [slice_batch(b, self.rank, self.size) for b in itertools.islice(iter(self.loader), k)]
        if not got:
            raise TesselError("the loader yielded no batch; prepare measures the tables on its first batches")
        return got

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip, self.steps = int(state["position"]), int(state["steps"])
