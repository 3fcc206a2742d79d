"""The pipeline engine: runs a schedule's forwards and backwards on this rank's stage, then updates it.

It has the interface of :class:`tessel.train.engine.Engine` (``step`` returns a ``StepResult``), so the
training loop does not care whether it drives a pipeline.

- ``gpipe`` / ``1f1b``: every step splits the batch into ``micro`` micro-batches, runs them and flushes;
  gradients (averaged over micro-batches and dp replicas) equal single-process training on the batch.
- ``async`` / ``async-stash`` / ``async-predict``: the same micro-batches and one update per step, but
  1F1B runs on without a flush (PipeDream, SpecTrain): the next step's first micro-batches enter before
  this step's last backwards, so those forwards meet weights that are older than their own update by
  ``schedules.ahead`` updates (N − k − 1 with one micro-batch per step, SpecTrain's setting). The
  pipeline is emptied only by :meth:`drain` (before a checkpoint and at the end).

Only the last stage computes the loss, so it is the one that logs (``loss`` is 0.0 elsewhere): a per-step
collective over the pp group would re-align the stages every step and bring back a fill bubble that the
asynchronous schedules exist to avoid.
- torch's schedules (``torch-gpipe``, ``torch-1f1b``, the interleaved and zero-bubble ones): torch.distributed.
  pipelining's own on the same stage, the peer the benchmark compares against (their messages are not counted
  by tessel.comm), stepped by :class:`TorchPipelineEngine`.

Data parallelism on a stage: after the backwards of an update, the step tail all-reduces the stage's
gradients over its dp group as one flat buffer (``dp.dense``). DDP cannot be used here: the asynchronous
schedules run each forward through ``functional_call`` on per-mini-batch tensors, which DDP's reducer does
not see. Tensor parallelism inside a stage needs nothing of the engine: its collectives run inside the
stage's layers, and its boundary messages are this rank's block of the activation (see ``Stage``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch.func import functional_call

from .. import comm
from ..chain import Chain, Runner
from ..choices import Prediction, Schedule
from ..errors import TesselError
from ..train.draws import SameDraws
from ..train.engine import StepResult, evaluation
from ..train.tail import StepTail
from .layers import prune
from .predict import StageWeights
from .schedules import ahead, async_ops, delay_scale, drain_ops, sync_ops
from .stage import Stage


def _on(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A batch (``None`` on a stage that reads none) on the stage's device."""
    return None if t is None else t.to(device, non_blocking=True)


class _StageEngine(ABC):
    """What every engine of a pipeline stage shares: the stage, its tail and update, and the step marks its
    idle share is measured from (``stats``)."""

    # the first stage reads inputs (and, holding the last too, targets), the last only targets, a middle one nothing
    reads = property(lambda self: "batch" if self.stage.first else "targets" if self.stage.last else None)
    computes_loss = property(lambda self: self.stage.last)  # torch's ZBV puts the last stage on pp rank 0

    def __init__(self, stage: Stage, chain: Chain, tail: StepTail, schedule: Schedule, micro_batches: int,
                 lr_of: Callable[[int], float], tables=None, autocast: Callable = contextlib.nullcontext) -> None:
        self.stage, self.chain, self.tail, self.schedule = stage, chain, tail, schedule
        self.autocast = autocast  # () -> the context a forward and its loss run in (mixed precision)
        # Sparse tables of this stage (the first stage's embedding, the last stage's sampled softmax), served
        # over its dp group; the tail reduces and updates them. Rows are read at their current version (see
        # docs/sparse.md): a lookup's gradient does not depend on the rows it read, so stashing them would
        # change nothing, and a row's owner updates it once per step, outside the stage's weight versions.
        self.tables, self.micro_batches, self.optimizer = tables, micro_batches, tail.optimizer
        self.params = dict((n, p) for n, p in stage.runner.named_parameters() if p.requires_grad)
        # the LR of the mini-batch of a step (a caller with its own schedule replaces it, see tessel.prepare)
        self.lr_of = lr_of
        self.stage_bytes = sum(p.numel() * p.element_size() for p in self.params.values())
        self.peak_kept_bytes = 0  # weight copies the in-flight graphs hold (stash, predict v2)
        self.updates = 0
        self.busy = 0.0  # seconds this stage computed (forward, backward, update), for the bubble measure
        # (wall clock, process CPU, busy, waited for activations, for gradients) at the first step's start, at
        # the fourth's (where the timed steps begin) and at the last step's end; every entry is a running total,
        # so a span of steps is the difference of its ends and nothing need be kept per step
        self._first: tuple[float, ...] | None = None
        self._fourth: tuple[float, ...] | None = None
        self._end: tuple[float, ...] | None = None
        self._steps = 0
        self.times_work = True  # whether ``busy`` counts the stage's forwards and backwards

    def _update(self, lr: float, global_norm: bool, upto: int | None = None) -> float | torch.Tensor:
        """The shared tail: dp average, tp sums, norm (whole model for flushed schedules, else the stage),
        clip, step (tables: rows of mini-batches up to ``upto``). Time spent waiting for other stages' norms
        is not this stage's work. The norm stays on the device where nothing needs it on the host (see
        StepTail), so a GPU stage launches its update without waiting for its backward to end."""
        t0, waited = time.perf_counter(), self.tail.waited
        norm = self.tail(lr, global_norm, upto)
        self.busy += time.perf_counter() - t0 - (self.tail.waited - waited)
        self.updates += 1
        return norm

    def _now(self) -> tuple[float, ...]:
        w = self.stage.waited
        return time.perf_counter(), time.process_time(), self.busy, w["activation"], w["grad"]

    def _mark(self) -> None:
        now = self._now()
        self._first = self._first or now
        if self._steps == 3:
            self._fourth = now
        self._steps += 1

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int, upcoming=None) -> StepResult:
        """One training step on this rank's batch (the inputs matter on the first stage, targets on the last)."""
        self._mark()
        self.stage.runner.train()
        with comm.guard(f"pipeline {self.schedule.name} step (stage {self.stage.index})", "pp"):
            # the first stage prefetches its tables' rows for the next inputs (the targets' tables sit on the last)
            result = self._step(inputs, targets, step, None if upcoming is None else upcoming[0])
        self._end = self._now()
        return result

    @abstractmethod
    def _step(self, inputs, targets, step: int, next_inputs) -> StepResult:
        """Run this engine's schedule for one step."""

    def drain(self, step: int) -> None:  # noqa: B027 - a flushed schedule has nothing in flight
        """Nothing is in flight between flushed steps."""

    def stats(self) -> dict:
        """This rank's measured share of idle time and CPU per step, over the steps after warm-up.

        A step runs from its start to the next step's start (so the loop's own work between steps counts
        as idle); the metrics' warm-up rule leaves the first 3 of more than 4 steps out."""
        timed = self._steps - 3 if self._steps > 4 else self._steps  # the metrics' warm-up rule
        start = self._fourth if self._steps > 4 else self._first
        wall, cpu, work, act, grad = (b - a for a, b in zip(start, self._end)) if timed else (0.0,) * 5
        if not self.times_work:
            work = 0.0
        per_step = (lambda v: v / timed if timed and self.times_work else None)
        return {"stage": self.stage.index, "busy_s": work, "wall_s": wall, "kept_bytes": self.peak_kept_bytes,
                "cpu_per_step": cpu / timed if timed else None,
                "bubble": (1 - work / wall) if wall > 0 and work > 0 else None,
                # the idle time's two causes that a stage can name: waiting on the previous stage's activations,
                # and on the next stage's gradients (the rest is the step tail's norm and the loop between steps)
                "wait_activation_per_step": per_step(act), "wait_grad_per_step": per_step(grad)}


class PipelineEngine(_StageEngine):
    """Stage ``stage`` of ``chain`` under one of tessel's schedules; ``tail``: the shared step tail (its
    ``dp_group`` averages the stage's gradients over the stage's replicas, its ``norm_group`` is the pp group)."""

    def __init__(self, stage: Stage, chain: Chain, tail: StepTail, schedule: Schedule, micro_batches: int,
                 lr_of: Callable[[int], float], prediction: Prediction | None = None, tables=None,
                 autocast: Callable = contextlib.nullcontext, delay_lr: int = 0) -> None:
        super().__init__(stage, chain, tail, schedule, micro_batches, lr_of, tables, autocast)
        self.delay_lr = delay_lr
        if tables and schedule.asynchronous:
            # the next step's first forwards run before this step's update: rows prefetched for them could
            # not wait for that update (2-D scheduling's late phase), so only in-step scheduling stays on
            tables.lookahead(False)
        self.first_step: int | None = None  # the step this engine started at (a resumed run's is not 0)
        self.base = 0  # the step whose mini-batch entered first since the pipeline was last empty (async)
        # the stage's u-th update belongs to mini-batch first_step + u: every one is applied, in order
        self.weights = (StageWeights(self.params, self.optimizer, schedule.weights, stage.index, stage.stages,
                                     prediction or "v1", micro_batches, lambda u: self.update_lr(self.first_step + u))
                        if schedule.asynchronous else None)
        self.fed = 0  # micro-batches that have entered this stage since the pipeline was last empty (async)
        self.last_backward = -1  # the micro-batch whose backward ends a flushed step (-1: every one may be)
        self.inflight: dict[int, tuple] = {}
        self.sharded = hasattr(stage.runner, "set_requires_gradient_sync")  # FSDP over the stage's dp ranks
        self.draws = SameDraws(micro_batches, any(p.is_cuda for p in self.params.values()))

    def update_lr(self, j: int) -> float:
        """The LR this stage's update of mini-batch ``j`` applies: the run's (``lr_of``, which ``prepare`` replaces),
        or PipeMare's rescheduled one (``delay_lr``, asynchronous schedules)."""
        st = self.stage
        if not self.delay_lr:
            return self.lr_of(j)
        return self.lr_of(j) * delay_scale(j, st.index, st.stages, self.micro_batches, self.delay_lr)

    # -- one forward / backward --------------------------------------------------------------------------

    def _forward(self, i: int, x: torch.Tensor | None, y: torch.Tensor | None, scale: float,
                 posted=None) -> torch.Tensor | None:
        st = self.stage
        if not st.first:
            x = st.take(posted or st.post_recv(activation=True)).requires_grad_(True)
        # an activation crosses in the wire dtype (bf16 under mixed precision) and is computed on as the
        # parameters' dtype, as one process would: the boundary rounds it once, its gradient goes back in the wire
        h = x.to(st.compute_in) if x is not None and x.is_floating_point() else x
        t0 = time.perf_counter()
        kept = leaves = None
        if self.tables:
            self.tables.tag(i // self.micro_batches)  # the mini-batch its rows' gradients belong to
        self.draws.before(i)  # a mini-batch's micro-batches draw alike (sampled candidates, dropout)
        s = ahead(i, self.micro_batches, st.index, st.stages)
        made = None if self.weights is None else self.weights.make(s)
        with self.autocast():
            if made is None:  # a flushed schedule, or weights that are the live ones (see StageWeights.make)
                out = st.runner(h)
            else:
                weights, leaves, ctx, kept = made
                with ctx:
                    out = functional_call(st.runner, weights, (h,))
                del weights
            if st.last:
                out = self.chain.loss(out, y) * scale
        loss = None
        if st.last:  # left on the device (StepResult.read reads it), summed in fp64 as the host's floats were
            loss = out.detach().to(torch.float64)
        else:
            out = out.to(st.dtype)  # the graph's end is what was sent: the gradient that comes back is its
            st.send_activation(out)
        self.inflight[i] = (x, out, leaves, kept)
        copies = len({e[3] for e in self.inflight.values() if e[3] is not None})
        self.peak_kept_bytes = max(self.peak_kept_bytes, copies * self.stage_bytes)
        self.busy += time.perf_counter() - t0
        return loss

    def _backward(self, i: int, posted=None) -> None:
        st = self.stage
        x, out, leaves, kept = self.inflight.pop(i)
        grad = None if st.last else st.take(posted or st.post_recv(activation=False))
        t0 = time.perf_counter()
        if self.tables:
            self.tables.final_backward(i == self.last_backward)
        if self.sharded:  # FSDP: keep the unsharded gradients until the step's last backward reduce-scatters them
            st.runner.set_requires_gradient_sync(i == self.last_backward)
        torch.autograd.backward(out, grad)
        if leaves is not None:
            for n, leaf in leaves.items():
                p = self.params[n]
                if leaf.grad is not None:
                    p.grad = leaf.grad if p.grad is None else p.grad.add_(leaf.grad)
        self.busy += time.perf_counter() - t0
        if not st.first:
            st.send_grad(x.grad)

    def _async_backward(self, i: int, posted, norms: list | None = None) -> None:
        """An asynchronous schedule's backward: after its mini-batch's last micro-batch, that mini-batch's update,
        at its own LR (the stream has later mini-batches in flight, whose rows the update leaves)."""
        self._backward(i, posted)
        m = self.micro_batches
        if (i + 1) % m == 0:
            norm = self._update(self.update_lr(self.base + i // m), global_norm=False, upto=i // m)
            if norms is not None:
                norms.append(norm)

    def _run(self, ops: list[tuple[str, int]], forward, backward) -> None:
        """Run ``ops`` in order, each op's receive posted one op early so its transfer overlaps compute
        (posting in op order keeps the per-peer message order)."""
        st, posted = self.stage, {}

        def post(j: int) -> None:
            if j < len(ops) and j not in posted:
                kind = ops[j][0]
                if (kind == "F" and not st.first) or (kind == "B" and not st.last):
                    posted[j] = st.post_recv(activation=kind == "F")

        for j, (kind, i) in enumerate(ops):
            post(j)
            post(j + 1)
            (forward if kind == "F" else backward)(i, posted.pop(j, None))

    def _update(self, lr: float, global_norm: bool, upto: int | None = None) -> float | torch.Tensor:
        norm = super()._update(lr, global_norm, upto)
        if self.weights is not None:
            self.weights.updates = self.updates
        return norm

    # -- steps --------------------------------------------------------------------------------------------

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int, next_inputs) -> StepResult:
        m = self.micro_batches
        inputs, targets = _on(inputs, self.stage.device), _on(targets, self.stage.device)
        # middle stages get no batch (they do not read one); the first uses inputs, the last targets
        xs = inputs.chunk(m) if inputs is not None else [None] * m
        ys = targets.chunk(m) if targets is not None else [None] * m
        lr = self.lr_of(step)
        self.first_step = step if self.first_step is None else self.first_step
        losses: list[torch.Tensor] = []
        if self.schedule.flushed:
            if self.tables and self.stage.first:
                with comm.guard("prefetch of sparse rows", "sparse"):
                    self.tables.begin_step(inputs, next_inputs)
            ops = sync_ops(self.schedule, self.stage.index, self.stage.stages, m)
            self.last_backward = [i for kind, i in ops if kind == "B"][-1]
            self._run(ops, lambda i, r: losses.append(self._forward(i, xs[i], ys[i], 1.0 / m, r)), self._backward)
            norm = self._update(lr, global_norm=True)
            # every neighbour has finished its step (the norm was summed over the stages): this step's sends
            # were all received, and waiting on them retires them at once
            self.stage.flush_sends()
        else:
            first, norms = self.fed, [0.0]
            self.base = step if first == 0 else self.base
            self._run(async_ops(self.stage.index, self.stage.stages, first, m),
                      lambda i, r: losses.append(self._forward(i, xs[i - first], ys[i - first], 1.0 / m, r)),
                      lambda i, r: self._async_backward(i, r, norms))
            norm = norms[-1]
            self.fed += m
        return StepResult(loss=sum(losses) if self.stage.last else 0.0, grad_norm=norm, lr=lr)

    def evaluate(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | torch.Tensor:
        """The mean loss of a batch under the stage's live weights, forwards only: eval mode, no gradient, no
        update, ``micro_batches`` micro-batches as a step (the last stage's; 0 elsewhere). Between steps, with
        nothing in flight: an asynchronous pipeline is drained first (its caller does)."""
        st, m = self.stage, self.micro_batches
        inputs, targets = _on(inputs, st.device), _on(targets, st.device)
        xs = inputs.chunk(m) if inputs is not None else [None] * m
        ys = targets.chunk(m) if targets is not None else [None] * m
        total = torch.zeros((), dtype=torch.float64, device=st.device)
        with evaluation(st.runner, self.tables), comm.guard(f"pipeline evaluation (stage {st.index})", "pp"):
            for x, y in zip(xs, ys):
                if not st.first:
                    x = st.take(st.post_recv(activation=True))
                with self.autocast():  # the activation computed on in the parameters' dtype, as in a step
                    out = st.runner(x.to(st.compute_in) if x.is_floating_point() else x)
                    if st.last:
                        total += self.chain.loss(out, y).to(torch.float64) / m
                if not st.last:
                    st.send_activation(out.to(st.dtype))
            st.flush_sends()  # the next stage took every activation before its loss was summed
        return total if st.last else 0.0

    def drain(self, step: int) -> None:
        """Finish every mini-batch still in flight and apply its update (asynchronous schedules only)."""
        if self.schedule.flushed:
            return
        with comm.guard(f"pipeline drain (stage {self.stage.index})", "pp"):
            self._run(drain_ops(self.stage.index, self.stage.stages, self.fed), None, self._async_backward)
            self.stage.flush_sends()
        # an empty pipeline starts its stream afresh (the next step fills it again)
        self.fed = 0


class TorchPipelineEngine(_StageEngine):
    """torch.distributed.pipelining's own schedule on exactly this rank's stage (or its two), cut by the same
    plan, then tessel's step tail: the peer the benchmarks compare tessel's schedules against."""

    def __init__(self, stage: Stage, chain: Chain, tail: StepTail, schedule: Schedule, micro_batches: int,
                 lr_of: Callable[[int], float], plan=None, autocast: Callable = contextlib.nullcontext) -> None:
        super().__init__(stage, chain, tail, schedule, micro_batches, lr_of, autocast=autocast)
        self.times_work = False  # torch runs the forwards and backwards where this engine cannot time them
        self._torch = _torch_schedule(stage, chain, schedule, micro_batches, plan, autocast)

    def evaluate(self, inputs, targets):
        raise TesselError("an evaluation forward runs on tessel's own schedules (1f1b, gpipe, async, async-predict), "
                          f"not torch's {self.schedule.name}")

    def _step(self, inputs, targets, step: int, next_inputs) -> StepResult:
        st, lr, losses = self.stage, self.lr_of(step), []
        inputs, targets = _on(inputs, st.device), _on(targets, st.device)
        if st.first and st.last:  # ZBV: rank 0 holds the first and the last stage
            self._torch.step(inputs, target=targets, losses=losses)
        elif st.first:
            self._torch.step(inputs)
        elif st.last:
            self._torch.step(target=targets, losses=losses)
        else:
            self._torch.step()
        norm = self._update(lr, global_norm=True)
        loss = sum(v.detach().to(torch.float64) for v in losses) / len(losses) if losses else 0.0
        return StepResult(loss=loss, grad_norm=norm, lr=lr)


def summary(stats: list[dict], plan, schedule: Schedule, micro: int, predict: Prediction) -> dict:
    """The run's pipeline figures from every rank's :meth:`PipelineEngine.stats`."""
    bubbles = [s["bubble"] for s in stats]
    busy = [s["busy_s"] for s in stats]
    return {"schedule": schedule.name, "micro_batches": micro,
            "predict": predict.name if schedule.weights == "predict" else None,
            "stage_of_rank": [s["stage"] for s in stats], "bubble_per_rank": bubbles,
            "bubble": sum(bubbles) / len(bubbles) if None not in bubbles else None,
            # the profile's balance (what the partitioner promised) and the measured one
            "plan_imbalance": plan.imbalance() if plan else None,
            "plan_bounds": [list(b) for b in plan.bounds] if plan else None,
            # measured stage balance: the busiest stage over the mean (1.0 = perfect)
            "busy_imbalance": max(busy) / (sum(busy) / len(busy)) if all(busy) else None,
            "kept_bytes_per_rank": [s["kept_bytes"] for s in stats],
            # seconds per step each rank blocked on a receive: an activation (previous stage), a gradient (next)
            "wait_activation_per_rank": [s["wait_activation_per_step"] for s in stats],
            "wait_grad_per_rank": [s["wait_grad_per_step"] for s in stats],
            # CPU seconds per step of each rank's process, gloo's threads included
            "cpu_per_step_per_rank": [s["cpu_per_step"] for s in stats]}


def _torch_schedule(stage: Stage, chain: Chain, schedule: Schedule, micro: int, plan, autocast):
    """torch.distributed.pipelining's schedule on exactly this rank's stage module, or on its two stages (the
    interleaved and zero-bubble schedules), cut by the same plan."""
    import torch.distributed.pipelining as pipelining

    device = next(stage.runner.parameters()).device
    cls = getattr(pipelining, schedule.torch_class)
    if schedule.stages_per_rank == 1:
        return cls(pipelining.PipelineStage(_Contiguous(stage.runner, autocast), stage.index, stage.stages, device,
                                            group=stage.group), micro, loss_fn=chain.loss)
    root = stage.runner.root
    parts = []
    for i in stage.held:
        lo, hi = plan.bounds[i]
        # each stage its own module tree with only its layers, over the very Parameters the optimizer steps:
        # zero-bubble schedules take a stage's weight gradients over all of its module's parameters
        tree = prune(copy.deepcopy(root, memo={id(p): p for p in root.parameters()}), chain, lo, hi)
        parts.append(pipelining.PipelineStage(_Contiguous(Runner(tree, chain, lo, hi), autocast), i, len(plan.bounds),
                                              device, group=stage.group))
    return cls(parts, micro, loss_fn=chain.loss)


class _Contiguous(torch.nn.Module):
    """A stage as torch's PipelineStage sends it: gloo sends only contiguous tensors, and under a 2-D grid a
    rank's block of the residual (what crosses the boundary) and its gradient are strided views."""

    def __init__(self, runner: torch.nn.Module, autocast: Callable = contextlib.nullcontext) -> None:
        super().__init__()
        self.runner, self.autocast = runner, autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad:  # the input gradient this stage sends back
            x.register_hook(torch.Tensor.contiguous)
        with self.autocast():
            return self.runner(x).contiguous()
