"""The dense optimizer a run's settings name, and setting a step's learning rate.

The LR schedule is a pure function of the step (:meth:`tessel.settings.Settings.lr_at`), so a resumed run
needs no scheduler state to continue exactly where it stopped.
"""

from __future__ import annotations

import inspect

import torch

from ..dtensor import is_dtensor
from ..settings import Settings


def build_optimizer(params, settings: Settings, sparse_grads: frozenset[int] = frozenset()) -> torch.optim.Optimizer:
    """``torch.optim``'s class for ``settings.optimizer`` at the schedule's first lr, given the settings its
    constructor takes (momentum or betas only where it has them; the ones its name fixes, such as nadamw's
    decoupled decay; on the CPU its fused kernel, else single-tensor updates). ``sparse_grads``: ids of the
    parameters whose gradient is sparse (torch DDP's sparse tables, the peer ``torch-sparse``)."""
    # a pipeline stage whose only weights are served tables has no dense parameter: an empty group, not an error
    params = [p for p in params if p.requires_grad] or [{"params": []}]
    cls = getattr(torch.optim, settings.optimizer.torch_class)
    takes = inspect.signature(cls.__init__).parameters
    given = {"lr": settings.lr, "weight_decay": settings.weight_decay, "momentum": settings.momentum,
             "betas": settings.betas, "momentum_decay": settings.momentum_decay}
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    if not any(p.is_cuda for p in tensors):
        # on the CPU torch's fused kernel where the class has one (Adam, AdamW, SGD, Adagrad: one pass over each
        # tensor, 6.5x faster than one op at a time on the default model's AdamW step) and the weights are plain
        # tensors (see without_fused_on_shards), else one tensor at a time (torch's foreach path is no faster on
        # the CPU); either is within 3e-16 of the loop the fp64 parity tests write, so their 1e-10 holds
        given = without_fused_on_shards({**given, **({"fused": True} if "fused" in takes else {"foreach": False})},
                                        tensors)
        # torch's fused kernels refuse a sparse gradient: those parameters step one tensor at a time, in a group of
        # their own (the rest keep the fused kernel)
        sparse = [p for p in tensors if id(p) in sparse_grads]
        if sparse and given.get("fused"):
            dense = [p for p in tensors if id(p) not in sparse_grads]
            params = [{"params": dense}] * bool(dense) + [{"params": sparse, "fused": False, "foreach": False}]
    # the settings the name fixes go in unfiltered: a torch without one fails here rather than running another rule
    return cls(params, **{k: v for k, v in given.items() if k in takes}, **dict(settings.optimizer.options))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def without_fused_on_shards(options: dict, params) -> dict:
    """``options`` (an optimizer's constructor arguments, or one of its groups) with torch's fused kernel turned
    off where ``params`` hold a DTensor: not every fused kernel has a DTensor rule in torch 2.13 (SGD's has none;
    AdamW's refused torch's tensor parallelism's mix of DTensor and plain tensors), so shards step one tensor at a
    time."""
    if options.get("fused") and any(is_dtensor(p) for p in params):
        return {**options, "fused": False, "foreach": False}
    return options
