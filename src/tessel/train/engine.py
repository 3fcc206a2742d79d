"""One training step: micro-batches through forward and backward, gradient sync, clipping, update.

The engine sees a model already wrapped for data parallelism (see ``tessel.parallelize``); it only
decides when gradients may be synchronised (the last micro-batch) and applies the optimizer.

Example::

    engine = Engine(ddp_model, optimizer, train_cfg)
    loss = engine.step(inputs, targets, step=0)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .. import comm
from ..config import TrainConfig
from .optim import lr_at, set_lr


@dataclass
class StepResult:
    loss: float  # mean loss over this rank's micro-batches
    grad_norm: float  # global gradient norm before clipping
    lr: float


class Engine:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device, self.dtype = self.params[0].device, self.params[0].dtype

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Move a batch tensor to the model's device; float features take the model's dtype."""
        return t.to(self.device, self.dtype if t.is_floating_point() else t.dtype, non_blocking=True)

    def _no_sync(self, last: bool):
        # DDP all-reduces in backward; skipping it on all but the last micro-batch sends each
        # gradient once per step instead of once per micro-batch.
        if not last and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int) -> StepResult:
        """One optimizer step on this rank's batch, split into ``cfg.micro_batches`` micro-batches."""
        self.model.train()
        m = self.cfg.micro_batches
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        total = 0.0
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
            # DDP's gradient all-reduce runs inside backward; a dead peer surfaces here.
            with self._no_sync(i == m - 1), comm.guard("all_reduce of gradients", "dp.dense"):
                loss = self.model(x, y) / m
                loss.backward()
            total += float(loss.detach())
        # Gradients are already identical on every dp rank, so each rank computes the same norm.
        if self.cfg.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip, foreach=False)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.params if p.grad is not None]))
        lr = lr_at(step, self.cfg)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=total, grad_norm=float(norm), lr=lr)
