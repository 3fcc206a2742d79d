"""Stop at a step boundary with a checkpoint when a worker gets SIGTERM.

A scheduler's preemption, ``kill <pid>`` and torchrun's shutdown all send SIGTERM. The handler only raises a
flag; the ranks then have to agree on the step after which all of them save, and they get the signal at
different moments. Each step every rank posts an asynchronous MAX all-reduce of its flag and reads the one
it posted the step before, so all ranks stop after the same step without a per-step barrier (an
asynchronous pipeline keeps running ahead)::

    stop = StopOnSignal()            # in every rank, before the loop
    for step in ...:
        ...
        if stop.requested():          # same answer on every rank, one step after the first signal
            save(...); break
    stop.close()

A rank blocked in a collective with a dead peer runs no Python handler; its collective times out instead.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from .. import comm


class StopOnSignal:
    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum, self.flag = signum, torch.zeros(1, dtype=torch.int32)
        self.result = self.pending = None
        self.previous = signal.signal(signum, self._raise)

    def _raise(self, signum, frame) -> None:
        self.flag.fill_(1)

    def requested(self) -> bool:
        """True on every rank once any rank has had the signal (answer lags the signal by one step)."""
        stop = False
        if self.pending is not None:
            self.pending.wait()
            stop = bool(self.result.item())
        self.result = self.flag.to(comm.device(), copy=True)  # the handler sets the CPU flag; nccl takes a GPU copy
        self.pending = comm.all_reduce(self.result, "meta", op=dist.ReduceOp.MAX, async_op=True)
        return stop

    def close(self) -> None:
        if self.pending is not None:
            self.pending.wait()  # every rank posted it; leave no collective half-done
            self.pending = None
        signal.signal(self.signum, self.previous)
