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
from .memory import SavedBytes
from .optim import lr_at, set_lr


@dataclass
class StepResult:
    loss: float  # mean loss over this rank's micro-batches
    grad_norm: float  # global gradient norm before clipping
    lr: float


class Engine:
    """``sparse``: the tables :func:`tessel.sparse.shard` took out of the model, updated here row by row.
    ``tp``: the model's :class:`tessel.tensor.TensorParallel` (gradient reduction and norm over the grid).

    ``activation_bytes``: what the first micro-batch's forward kept for backward, on the first step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                 sparse=None, tp=None) -> None:
        self.model, self.optimizer, self.cfg, self.sparse, self.tp = model, optimizer, cfg, sparse, tp
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        self.activation_bytes = None

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Move a batch tensor to the model's device; float features take the model's dtype."""
        return t.to(self.device, self.dtype if t.is_floating_point() else t.dtype, non_blocking=True)

    def _no_sync(self, last: bool):
        # DDP all-reduces in backward; skipping it on all but the last micro-batch sends each
        # gradient once per step instead of once per micro-batch.
        if not last and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int,
             next_inputs: torch.Tensor | None = None) -> StepResult:
        """One optimizer step on this rank's batch, split into ``cfg.micro_batches`` micro-batches.

        ``next_inputs``: the next step's inputs, if known, so scheduled sparse tables fetch ahead."""
        self.model.train()
        m = self.cfg.micro_batches
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        if self.sparse:
            with comm.guard("prefetch of sparse rows", "sparse"):
                self.sparse.begin_step(inputs, next_inputs)
        total = 0.0
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
            # DDP's gradient all-reduce runs inside backward; a dead peer surfaces here.
            with self._no_sync(i == m - 1), comm.guard("all_reduce of gradients", "dp.dense"):
                if self.activation_bytes is None:
                    with SavedBytes(self.params) as saved:
                        loss = self.model(x, y) / m
                    self.activation_bytes = saved.bytes
                else:
                    loss = self.model(x, y) / m
                if self.sparse:
                    self.sparse.final_backward(i == m - 1)
                loss.backward()
            total += float(loss.detach())
        # Gradients are already identical on every dp rank, so each rank computes the same norm; the
        # sparse tables' share comes back from their reduce, summed over owners.
        if self.tp is not None:
            sq = self.tp.finish_backward()
        else:
            sq = torch.zeros((), dtype=torch.float64)
            for p in self.params:
                if p.grad is not None:
                    g = p.grad.coalesce()._values() if p.grad.is_sparse else p.grad
                    sq += g.double().pow(2).sum()
        if self.sparse:
            with comm.guard("exchange of sparse row gradients", "sparse"):
                sq += self.sparse.reduce()
        norm = sq.sqrt()
        scale = 1.0
        if self.cfg.clip > 0:
            # torch.nn.utils.clip_grad_norm_'s rule, over dense and sparse gradients together
            scale = min(1.0, self.cfg.clip / (float(norm) + 1e-6))
            if scale < 1.0:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(scale)
        lr = lr_at(step, self.cfg)
        set_lr(self.optimizer, lr)
        if self.sparse:
            # Rows first: the next step's rows that waited for this update travel during the dense step.
            self.sparse.step(lr, scale)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=total, grad_norm=float(norm), lr=lr)
