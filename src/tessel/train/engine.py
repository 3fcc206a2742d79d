"""One training step: micro-batches through forward and backward, gradient sync, clipping, update.

The engine sees a model already wrapped for data parallelism (see ``tessel.parallelize``); it only
decides when gradients may be synchronised (the last micro-batch) and hands the rest to the step tail.

Example::

    engine = Engine(ddp_model, StepTail(params, optimizer, clip=1.0), micro_batches=2, lr_of=settings.lr_at)
    result = engine.step(inputs, targets, step=0)      # StepResult(loss, grad_norm, lr)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .. import comm
from .draws import SameDraws
from .memory import SavedBytes
from .tail import StepTail


@contextlib.contextmanager
def evaluation(module: torch.nn.Module, tables=None):
    """An evaluation forward's context: ``module`` in eval mode (its mode restored after), no gradient, and the
    served ``tables`` readable whole (a full softmax reads its table's every row: SparseTables.whole)."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad(), tables.whole() if tables else contextlib.nullcontext():
            yield
    finally:
        module.train(was)


@dataclass
class StepResult:
    """A step's figures. ``loss`` and ``grad_norm`` may be 0-dim tensors the device is still computing (the
    engines, pipelined or not, leave them there unless served tables need the clip on the host, so the host
    can make the next batch meanwhile): ``read()``."""

    loss: float | torch.Tensor  # mean loss over this rank's micro-batches
    grad_norm: float | torch.Tensor  # global gradient norm before clipping
    lr: float

    def read(self) -> StepResult:
        """The same figures as floats (waits for the device where they are tensors)."""
        return StepResult(float(self.loss), float(self.grad_norm), self.lr)


class StepEngine(Protocol):
    """What the training loop steps: :class:`Engine` (unpipelined), :class:`tessel.pipeline.PipelineEngine` and
    :class:`tessel.pipeline.TorchPipelineEngine` (a pipeline stage)."""

    reads: str | None  # what of each batch this rank reads: "batch", "targets" (a pipeline's last stage) or None
    computes_loss: bool  # whether this rank's StepResult.loss is the loss (in a pipeline, the last stage's rank)
    lr_of: Callable[[int], float]  # the LR of a step's mini-batch (a caller with its own schedule replaces it)

    def step(self, inputs, targets, step: int, upcoming=None) -> StepResult: ...

    def evaluate(self, inputs, targets) -> float | torch.Tensor: ...  # a batch's mean loss, forwards only

    def drain(self, step: int) -> None: ...  # finish whatever mini-batch is in flight (before a checkpoint)

    def stats(self) -> dict | None: ...  # this rank's figures for the run summary


class Engine:
    """The unpipelined engine: ``model(x, y)`` per micro-batch (DDP syncs gradients in the last backward),
    then the shared :class:`~tessel.train.tail.StepTail`. ``tables``: sparse tables the model's forward uses
    (their rows are fetched ahead and their backward finished here; the tail reduces and updates them).

    ``activation_bytes``: what the first micro-batch's forward kept for backward, on the first step."""

    reads = "batch"  # what of each batch a rank reads: "batch", "targets" (a pipeline's last stage) or None
    computes_loss = True  # every rank (in a pipeline only the rank holding the last stage)

    def __init__(self, model: torch.nn.Module, tail: StepTail, micro_batches: int, lr_of: Callable[[int], float],
                 tables=None, autocast: Callable = contextlib.nullcontext) -> None:
        self.model, self.tail, self.tables, self.micro_batches = model, tail, tables, micro_batches
        self.autocast = autocast  # () -> the context each forward and its loss run in (mixed precision)
        # entered around each micro-batch's forward and backward (torch's loss_parallel for its TP peer)
        self.loss_context = tail.tp.loss_context if tail.tp is not None else contextlib.nullcontext
        self.optimizer = tail.optimizer
        self.params = tail.params
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        self.activation_bytes = None
        self.draws = SameDraws(micro_batches, self.device.type == "cuda")
        # the LR of a step (a caller with its own schedule replaces it, see tessel.prepare)
        self.lr_of = lr_of

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Move a batch tensor to the model's device; float features take the model's dtype."""
        return t.to(self.device, self.dtype if t.is_floating_point() else t.dtype, non_blocking=True)

    def _no_sync(self, last: bool):
        # DDP all-reduces in backward; skipping it on all but the last micro-batch sends each
        # gradient once per step instead of once per micro-batch. FSDP then keeps the unsharded gradients
        # until the last micro-batch reduce-scatters their sum.
        if hasattr(self.model, "set_requires_gradient_sync"):
            self.model.set_requires_gradient_sync(last)
        elif not last and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int,
             upcoming: tuple[torch.Tensor, ...] | None = None) -> StepResult:
        """One optimizer step on this rank's batch, split into ``micro_batches`` micro-batches.

        ``upcoming``: the next step's (inputs, targets), or its inputs alone, if known, so scheduled sparse tables
        fetch ahead."""
        self.model.train()
        m = self.micro_batches
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        upcoming = None if upcoming is None else tuple(self.to_device(t) for t in upcoming)
        if self.tables:
            with comm.guard("prefetch of sparse rows", "sparse"):
                self.tables.begin_step((inputs, targets), upcoming)
        total = torch.zeros((), dtype=torch.float64, device=self.device)  # summed on the device: no wait per loss
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
            # DDP's gradient all-reduce runs inside backward; a dead peer surfaces here.
            self.draws.before(i)
            with self._no_sync(i == m - 1), comm.guard("all_reduce of gradients", "dp.dense"), self.loss_context():
                if self.activation_bytes is None:
                    with SavedBytes(self.params) as saved, self.autocast():
                        loss = self.model(x, y) / m
                    self.activation_bytes = saved.bytes
                else:
                    with self.autocast():
                        loss = self.model(x, y) / m
                if self.tables:
                    self.tables.final_backward(i == m - 1)
                loss.backward()
                loss = loss.detach()
                total += loss.full_tensor() if hasattr(loss, "full_tensor") else loss  # torch's TP: a DTensor
        lr = self.lr_of(step)
        norm = self.tail(lr)
        return StepResult(loss=total, grad_norm=norm, lr=lr)

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of this rank's batch under the weights as they are: forwards only, in eval mode, no
        gradient, no update, in ``micro_batches`` micro-batches as a step."""
        m = self.micro_batches
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with evaluation(self.model, self.tables), comm.guard("evaluation forward", "tp"), self.loss_context():
            for x, y in zip(inputs.chunk(m), targets.chunk(m)):
                with self.autocast():
                    loss = self.model(x, y)
                loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss  # torch's TP: a DTensor
                total += loss.to(torch.float64) / m
        return total

    def drain(self, step: int) -> None:
        """Nothing is in flight between steps of an unpipelined model."""

    def stats(self) -> None:
        return None
