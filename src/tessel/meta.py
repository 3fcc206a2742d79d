"""A model built on the meta device: its shapes, no storage, and no time spent drawing values it cannot hold.

The launcher's checks, each worker deciding whether it builds its weights after parallelizing
(tessel.materialize) and the planner's profile build a model on the meta device first. A meta tensor holds no
values, yet ``nn.init``'s fills still run on it, and some (``normal_``; ``trunc_normal_``'s ``erfinv_`` and
``clamp_``) have meta kernels written in Python whose first call imports ``torch._dynamo``: a second of the
launcher's start before any worker runs, for nothing. Inside :func:`on_meta` those fills return their tensor as
it is; shapes, dtypes and parameters are what ``with torch.device("meta")`` gives.

    >>> import torch
    >>> with on_meta():
    ...     emb = torch.nn.Embedding(10, 4)
    >>> emb.weight.device.type, tuple(emb.weight.shape)
    ('meta', (10, 4))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

# fills that change values only, never a shape: nn.init's (the mode sees the outermost call, so an init function
# that hands itself to the mode is seen whole) and the tensor methods models call directly
_FILLS = frozenset({*(getattr(torch.nn.init, name) for name in dir(torch.nn.init)
                      if name.endswith("_") and not name.startswith("_")),
                    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.erfinv_, torch.Tensor.clamp_,
                    torch.Tensor.clamp_min_, torch.Tensor.clamp_max_, torch.Tensor.exponential_,
                    torch.Tensor.log_normal_, torch.Tensor.cauchy_, torch.Tensor.geometric_})


class _NoFills(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FILLS:
            t = args[0] if args else kwargs.get("tensor", kwargs.get("self"))  # nn.init's name, or the method's
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules inside on the meta device, as ``with torch.device("meta")`` does, without their fills."""
    with torch.device("meta"), _NoFills():
        yield
