"""What a run is trained with that is not a parallel decision: optimizer, LR rule, clipping, dtype, timeouts.

The composer takes a :class:`tessel.plan.ParallelPlan` (how the model is spread) and one :class:`Settings`
(how it is trained), never the config: ``tessel train`` resolves its config into both once
(:mod:`tessel.resolve`), and ``tessel.prepare`` builds them from the user's own optimizer and loop.

    >>> s = Settings(optimizer="sgd", lr=0.1, warmup=0, lr_schedule="constant")
    >>> s.optimizer.torch_class, s.lr_at(5)
    ('SGD', 0.1)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

import torch

from .choices import Optimizer, Precision, optimizer, precision

DTYPES = {"float32": torch.float32, "float64": torch.float64}
LR_SCHEDULES = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class Settings:
    optimizer: Optimizer = field(default_factory=lambda: optimizer("adamw"))
    lr: float = 3e-3
    momentum: float = 0.9  # sgd only (tessel train's default)
    betas: tuple[float, float] = (0.9, 0.999)  # adam, adamw, nadamw (torch's default)
    momentum_decay: float = 0.004  # nadamw: how fast NAdam's momentum weight ramps up to beta1 (torch's default)
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"  # cosine | linear | constant, after a linear warm-up
    warmup: int = 20
    min_lr_ratio: float = 0.1
    steps: int = 300  # the LR schedule's length
    clip: float = 1.0  # max gradient norm; 0: no clipping
    dtype: str = "float32"  # float32 | float64
    global_batch: int = 32
    seed: int = 0
    timeout: float = 30.0  # seconds any collective may wait
    precision: Precision = field(default_factory=lambda: precision("fp32"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", optimizer(self.optimizer))  # a name resolves to its record once
        object.__setattr__(self, "precision", precision(self.precision))

    @property
    def torch_dtype(self) -> torch.dtype:
        """The parameters' dtype (their masters under mixed precision)."""
        return DTYPES[self.dtype]

    @property
    def compute_dtype(self) -> torch.dtype:
        """What forward and backward compute in (autocast's dtype under mixed precision)."""
        return getattr(torch, self.precision.compute) if self.precision.compute else self.torch_dtype

    @property
    def wire_dtype(self) -> torch.dtype:
        """What activations, their gradients and looked-up rows cross a channel in."""
        return self.compute_dtype

    def autocast(self, device_type: str = "cpu"):
        """The context a forward (and its loss) runs in: autocast to the compute dtype under mixed precision."""
        if not self.precision.compute:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.compute_dtype)

    def with_(self, **changes) -> Settings:
        return replace(self, **changes)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then the named decay. A pure
        function of the step, so a resumed run needs no scheduler state to continue exactly."""
        if self.warmup and step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.lr_schedule == "constant":
            return self.lr
        frac = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        floor = self.lr * self.min_lr_ratio
        if self.lr_schedule == "linear":
            return self.lr - (self.lr - floor) * frac
        return floor + 0.5 * (self.lr - floor) * (1 + math.cos(math.pi * frac))

    @property
    def has_direction(self) -> bool:
        """Whether the optimizer keeps a smoothed update direction (what weight prediction extrapolates)."""
        o = self.optimizer
        return o.direction and (not o.momentum_state or self.momentum > 0)

    @property
    def state_tensors(self) -> int:
        """Optimizer state tensors per parameter element (memory)."""
        o = self.optimizer
        return 0 if o.momentum_state and not self.momentum else o.states
