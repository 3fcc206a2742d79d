"""The dense optimizer a run's settings name, and setting a step's learning rate.

The LR schedule is a pure function of the step (:meth:`tessel.settings.Settings.lr_at`), so a resumed run
needs no scheduler state to continue exactly where it stopped.
"""

from __future__ import annotations

import inspect

import torch

from ..settings import Settings


def build_optimizer(params, settings: Settings) -> torch.optim.Optimizer:
    """``torch.optim``'s class for ``settings.optimizer`` at the schedule's first lr, given the settings its
    constructor takes (momentum or betas only where it has them; the ones its name fixes, such as nadamw's
    decoupled decay; single-tensor updates where it can, for fp64 parity)."""
    # a pipeline stage whose only weights are served tables has no dense parameter: an empty group, not an error
    params = [p for p in params if p.requires_grad] or [{"params": []}]
    cls = getattr(torch.optim, settings.optimizer.torch_class)
    takes = inspect.signature(cls.__init__).parameters
    given = {"lr": settings.lr, "weight_decay": settings.weight_decay, "momentum": settings.momentum,
             "betas": settings.betas, "momentum_decay": settings.momentum_decay}
    if not any(p.is_cuda for g in params for p in (g["params"] if isinstance(g, dict) else [g])):
        given["foreach"] = False  # on the CPU one tensor at a time: the order fp64 parity compares in, no slower
    # the settings the name fixes go in unfiltered: a torch without one fails here rather than running another rule
    return cls(params, **{k: v for k, v in given.items() if k in takes}, **dict(settings.optimizer.options))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
