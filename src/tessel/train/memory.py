"""Activation memory: the bytes autograd keeps for backward, counted as the forward saves them.

Peak resident memory mixes in the allocator, the interpreter and the weights; what parallel layouts
change is what the forward pass leaves for backward. :class:`SavedBytes` counts each distinct storage
that autograd saves, leaving out the parameters themselves (a gathered copy of a weight counts).

    with SavedBytes(model.parameters()) as saved:
        loss = model(x, y)
    print(saved.bytes)
"""

from __future__ import annotations

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)  # a DTensor's own shard


class SavedBytes:
    def __init__(self, params) -> None:
        self._skip = {_local(p).untyped_storage().data_ptr() for p in params}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key not in self._skip and key not in self._seen and not _local(t).is_meta:
            self._seen.add(key)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
