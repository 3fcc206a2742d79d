"""One mini-batch, one set of random draws, however it is split over micro-batches.

dp replicas already share one random stream (the same seed everywhere), so every rank draws the same
sampled-softmax candidates and dropout masks for its share of a step. :class:`SameDraws` makes micro-batches
behave the same way: each micro-batch of a mini-batch starts from the random state the first one started
from. A step's math then depends on the global batch alone, not on dp x micro-batches, which is what lets a job
re-formed on fewer hosts (more micro-batches per rank, :func:`tessel.plan.regrouped`) continue the trajectory
of the larger one. Example::

    draws = SameDraws(micro_batches=2)
    for i, (x, y) in enumerate(zip(inputs.chunk(2), targets.chunk(2))):
        draws.before(i)          # micro-batch 1 replays micro-batch 0's draws
        loss = model(x, y)
"""

from __future__ import annotations

import torch


class SameDraws:
    """``before(i)`` ahead of the forward of micro-batch ``i`` (counted over the stream: ``i // micro_batches``
    is its mini-batch). The CPU generator is the one the sampled softmax draws from; CUDA's follows where used."""

    def __init__(self, micro_batches: int, cuda: bool = False) -> None:
        self.m, self.cuda = micro_batches, cuda
        self.state: tuple | None = None

    def before(self, i: int) -> None:
        if self.m == 1:
            return
        if i % self.m == 0:
            self.state = (torch.get_rng_state(), torch.cuda.get_rng_state() if self.cuda else None)
            return
        cpu, gpu = self.state
        torch.set_rng_state(cpu)
        if gpu is not None:
            torch.cuda.set_rng_state(gpu)
