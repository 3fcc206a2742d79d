"""What the planner plans for, without a config: how to build the plain model and a batch, how it trains, and the
parallel decisions every candidate keeps (how tables are held, the DDP hook).

``tessel plan`` and ``tessel train --plan auto`` make one from their config (:func:`tessel.resolve.job_of`); a
program can make its own from any model::

    job = Job(build=lambda: MyNet(), batch=lambda b, dp: (x[: b // dp], y[: b // dp]),
              settings=Settings(optimizer="sgd", lr=0.1, global_batch=32))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..plan import ParallelPlan
from ..settings import Settings


@dataclass(frozen=True)
class Job:
    # a fresh plain model in the training dtype, seeded by the caller; also called under torch.device("meta")
    build: Callable[[], nn.Module]
    # (global batch, dp) -> rank 0's first batch of that dp: the model's argument tuple, in the training dtype
    batch: Callable[[int, int], tuple]
    settings: Settings
    base: ParallelPlan = field(default_factory=lambda: ParallelPlan(dp=1))  # its sparse policy, DDP hook, buckets
