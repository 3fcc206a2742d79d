"""Optimizer and learning-rate schedule from the config.

The schedule is a pure function of the step, so a resumed run needs no scheduler state to continue
exactly where it stopped.
"""

from __future__ import annotations

import math

import torch

from ..config import TrainConfig


def build_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    """``torch.optim`` optimizer named by ``cfg.optimizer`` at the schedule's first lr."""
    # a pipeline stage whose only weights are served tables has no dense parameter: an empty group, not an error
    params = [p for p in params if p.requires_grad] or [{"params": []}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then the named decay."""
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "linear":
        return cfg.lr - (cfg.lr - floor) * frac
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * frac))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
