"""One pipeline stage: its layers as a module, and the activations and gradients it trades with neighbours.

Activations go forward and their gradients come back over the pp group with point-to-point messages
through :mod:`tessel.comm` (channel ``pp``). Sends are asynchronous, so a stage never waits for its
neighbour to take a message; receives block and end the job after the collective timeout. Every
message's shape comes from the stage plan, and a stage that produces anything else is stopped with an
error naming both shapes rather than let its neighbour read garbage.

Example::

    runner = Runner(pruned_model, chain, lo, hi)
    stage = Stage(runner, index=1, stages=4, ranks=[0, 2, 4, 6], plan=plan, micro=8, micro_batches=4)
    x = stage.take(stage.post_recv(activation=True))   # posted early, waited for when needed
"""

from __future__ import annotations

import time

import torch

from .. import comm
from ..chain import Runner
from ..errors import PlanError
from .partition import StagePlan


class Stage:
    """Stage ``index`` of ``stages``; ``ranks``: the global rank of each stage in this rank's pp group; ``micro``:
    rows per micro-batch; ``micro_batches``: micro-batches per step.

    ``held``: the plan's stages this rank runs when torch's multi-stage schedules give it two (``runner``
    then holds both); first and last mean holding the plan's first and last stage."""

    def __init__(self, runner: Runner, index: int, stages: int, ranks: list[int], plan: StagePlan,
                 micro: int, dtype: torch.dtype, group=None, held: list[int] | None = None,
                 micro_batches: int = 1, compute_in: torch.dtype | None = None,
                 device: torch.device | None = None) -> None:
        self.runner, self.index, self.stages, self.ranks, self.group = runner, index, stages, ranks, group
        self.held = held or [index]
        self.first, self.last = 0 in self.held, len(plan.bounds) - 1 in self.held
        # messages cross in ``dtype`` (bf16 under mixed precision); a received activation is computed on in
        # ``compute_in`` (the parameters' dtype), on the stage's device
        self.dtype, self.compute_in = dtype, compute_in or dtype
        self.device = device or next((p.device for p in runner.parameters()), comm.device())
        # The profile gives the whole activation a layer hands on; under tensor parallelism this rank sends
        # and receives only its block of it (the chain knows the layout), to the rank of the same grid
        # coordinate on the neighbouring stage.
        local = runner.chain.local
        lo, hi = plan.bounds[index]
        self.in_shape = local(lo - 1, (micro, *plan.boundary(index - 1)[0])) if not self.first else None
        self.out_shape = local(hi - 1, (micro, *plan.boundary(index)[0])) if not self.last else None
        self.pending: list = []  # sends not yet known to be complete, with their tensors kept alive
        # sends kept unwaited: twice the most both neighbours together can hold unreceived (a stream's stages + a
        # step's micro-batches), so a wait on an older one never waits on a neighbour that waits on this stage
        self.depth = 2 * (stages + micro_batches)
        # seconds blocked on receives, by what was awaited: an activation from the previous stage or a gradient
        # from the next (where an asynchronous stage idles, and on which neighbour)
        self.waited = {"activation": 0.0, "grad": 0.0}

    def _check(self, t: torch.Tensor, shape, what: str) -> None:
        if tuple(t.shape) != tuple(shape) or t.dtype != self.dtype:
            raise PlanError(f"pipeline stage {self.index} {what} of shape {tuple(t.shape)} ({t.dtype}) but the "
                            f"stage plan expects {tuple(shape)} ({self.dtype}); every micro-batch must have the "
                            "profiled shape (same micro-batch size and sequence length)")

    def _send(self, t: torch.Tensor, peer: int) -> None:
        t = t.contiguous()
        self.pending.append((comm.isend(t, self.ranks[peer], "pp", group=self.group), t))
        # gloo's send handles report completion only once waited on (is_completed stays False, there is no
        # future), so a send is retired by waiting on it. A neighbour holds at most `depth` of this stage's
        # messages unreceived (1F1B's warm-up depth, or GPipe's micro-batches), so waiting on anything older
        # returns at once and cannot deadlock; without it every sent tensor stayed alive for the whole run.
        while len(self.pending) > self.depth:
            self.pending.pop(0)[0].wait()

    def send_activation(self, out: torch.Tensor) -> None:
        self._check(out, self.out_shape, "produced an activation")
        self._send(out.detach(), self.index + 1)

    def send_grad(self, grad: torch.Tensor) -> None:
        self._send(grad, self.index - 1)

    def post_recv(self, activation: bool):
        """Post the receive of the next activation (from the previous stage) or gradient (from the next) now,
        so its bytes can land while this stage still computes; ``take`` it when needed."""
        shape, peer = (self.in_shape, self.index - 1) if activation else (self.out_shape, self.index + 1)
        buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        return comm.irecv(buf, self.ranks[peer], "pp", group=self.group), buf, "activation" if activation else "grad"

    def take(self, posted) -> torch.Tensor:
        work, buf, kind = posted
        t0 = time.perf_counter()
        work.wait()
        self.waited[kind] += time.perf_counter() - t0
        return buf

    def flush_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
