"""Which weights a stage's forward and backward see, for each pipeline schedule.

A stage never swaps parameter storage under a live autograd graph (PipeDream's runtime broke on that
from PyTorch 1.5). Instead each forward runs through ``torch.func.functional_call`` on tensors made
for that mini-batch, whose gradients are added to the real parameters' ``.grad`` afterwards:

- ``stale`` (``async``): an alias of the live storage with its own version counter; the optimizer
  updates it in place, so the backward reads the newer weights (no stashing, the classic inconsistency).
- ``stash`` (``async-stash``, PipeDream): a copy taken at the forward; the backward uses it. Costs one
  copy of the stage's weights per weight version in flight.
- ``predict`` (``async-predict``, SpecTrain): Ŵ = W − (η₁ + … + η_s)·v, with v the optimizer's smoothed update
  direction (SGD's momentum buffer; Adam's m̂/(√v̂+ε), plus the decoupled decay for AdamW), s the number of
  updates the stage will make before this micro-batch's own update (N − k − 1 with one update per
  mini-batch, as in the paper; see ``schedules.ahead``) and η₁ … η_s those updates' own LRs (the paper's
  s·η with a constant LR; under warm-up or decay each update's LR is its mini-batch's, see ``lr_of``).
  - ``v1`` (the paper's version, default): the forward uses s + ⌊k/2⌋; the backward uses weights
    predicted again at backward time with ⌊k/2⌋. The forward's Ŵ is not kept: saved-tensor hooks
    replace it in the graph by a token and rebuild the backward's weights when autograd asks, so no
    weight version is stored.
  - ``v2`` (the official repo's later version): the forward uses s and the backward reuses that Ŵ,
    which the graph keeps (one weight copy per weight version in flight, like stashing).
  - Forwards of the same weight version and s share one Ŵ, made once (v1 without its half-way term, v2, opt).
  - ``opt`` (the optimizer-dependent prediction of XPipe, arXiv 1911.04610, and PipeOptim, arXiv 2312.00839):
    Ŵ is where the run's own optimizer would take W in its next s updates, each at its own LR, from its own
    state (momentum buffer, Adam's moments and step count, weight decay) with no gradient yet to come
    (:func:`rolled`). For SGD with momentum μ that is W − (η₁μ + η₂μ² + … + η_sμˢ)·buf, the momentum decaying
    as FTPipe's msnag has it; for Adam(W) each step's bias corrections and decoupled decay. As in PipeOptim the
    prediction is for the forward only: the backward multiplies by the live weights of its time (no copy kept,
    saved weights rebuilt as for ``async``), and s is the plain N − k − 1.

Example::

    >>> import torch
    >>> lin = torch.nn.Linear(3, 2)
    >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    >>> w = StageWeights(dict(lin.named_parameters()), opt, "predict", stage=0, stages=2)
    >>> weights, leaves, ctx, kept = w.make(ahead=1)   # before any update: Ŵ = W
    >>> bool((weights["weight"] == lin.weight).all())
    True
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from .. import choices
from ..choices import Optimizer, Prediction
from ..errors import PlanError

MODES = ("stale", "stash", "predict")  # Schedule.weights of the asynchronous schedules


def staleness(stage: int, stages: int, variant: Prediction | str) -> tuple[int, int]:
    """(forward s, backward s) of SpecTrain's two variants for stage ``stage`` of ``stages`` (0 = input), one
    update per mini-batch; :func:`tessel.pipeline.schedules.ahead` gives the forward s for any schedule."""
    if choices.prediction(variant).again_in_backward:
        return stage // 2 + stages - stage - 1, stage // 2
    return stages - stage - 1, 0


def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Weight prediction needs a smoothed update direction: SGD with momentum, Adam or AdamW."""
    rec = next((o for o in choices.records(Optimizer) if getattr(torch.optim, o.torch_class) is type(optimizer)),
               None)
    momentum = min((g.get("momentum", 0.0) for g in optimizer.param_groups), default=0.0)
    if rec is not None and rec.direction and (not rec.momentum_state or momentum > 0):
        return
    valid = ", ".join(o.torch_class + (" (momentum > 0)" if o.momentum_state else "")
                      for o in choices.records(Optimizer) if o.direction)
    raise PlanError(f"pipeline.schedule=async-predict cannot predict weights for {type(optimizer).__name__}"
                    + (" without momentum" if rec is not None and rec.momentum_state else "") + f"; valid: {valid}")


def direction(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor | None:
    """v such that the optimizer's next update is about ``p -= lr * v``; None before its first step."""
    state = optimizer.state.get(p)
    if not state:
        return None
    group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
    if isinstance(optimizer, torch.optim.SGD):
        return state["momentum_buffer"]
    beta1, beta2 = group["betas"]
    step = float(state["step"])
    v = (state["exp_avg"] / (1 - beta1 ** step)) / ((state["exp_avg_sq"] / (1 - beta2 ** step)).sqrt()
                                                   + group["eps"])
    if isinstance(optimizer, torch.optim.AdamW) and group["weight_decay"]:
        v = v + group["weight_decay"] * p.detach()
    return v


def rolled(optimizer: torch.optim.Optimizer, p: torch.Tensor, lrs: list[float]) -> torch.Tensor:
    """``p`` after ``len(lrs)`` more updates of ``optimizer`` (SGD, Adam, AdamW, as torch makes them), the i-th at
    ``lrs[i]``, with every gradient to come taken as zero: what its state alone (momentum, moments, weight decay)
    still does to ``p``. A new tensor, detached; ``p`` itself before the optimizer's first update."""
    state, w = optimizer.state.get(p), p.detach().clone()
    if not state:
        return w
    group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
    wd = group["weight_decay"]
    if isinstance(optimizer, torch.optim.SGD):
        mu, damp, buf = group["momentum"], group["dampening"], state["momentum_buffer"].clone()
        for lr in lrs:
            g = w * wd  # the L2 term is all the gradient there is
            buf.mul_(mu).add_(g, alpha=1 - damp)
            w.add_(g.add(buf, alpha=mu) if group["nesterov"] else buf, alpha=-lr)
        return w
    (b1, b2), eps, t = group["betas"], group["eps"], float(state["step"])
    m, v = state["exp_avg"].clone(), state["exp_avg_sq"].clone()
    vmax = state["max_exp_avg_sq"].clone() if group.get("amsgrad") else None
    decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
    for lr in lrs:
        t += 1
        if decoupled:
            w.mul_(1 - lr * wd)
        g = torch.zeros_like(w) if decoupled or not wd else w * wd
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        if vmax is not None:
            torch.maximum(vmax, v, out=vmax)
        denom = ((v if vmax is None else vmax).sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
        w.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
    return w


class _RebuildSaved:
    """Saved-tensor hooks: a saved weight of the forward is packed as a token and rebuilt on unpack (from the
    weights the backward is to multiply by). Under autocast an op saves not the weight but its bf16 copy (or a
    view of that copy): found through the autograd graph, it is rebuilt as the same cast of the rebuilt weight."""

    HOPS = 4  # cast and view nodes between a saved tensor and the weight it was made from

    def __init__(self, weights: dict[str, torch.Tensor], rebuild) -> None:
        self.by_storage = {t.untyped_storage().data_ptr(): (name, t.storage_offset()) for name, t in weights.items()}
        # the graph node each weight's copies hang from: its grad_fn, or for a leaf the node accumulating its grad
        self.by_node = {t.grad_fn: name for name, t in weights.items() if t.grad_fn is not None}
        self.by_leaf = {id(t): name for name, t in weights.items() if t.grad_fn is None}
        self.weights, self.rebuild, self.cache = weights, rebuild, {}
        # a cast changes the dtype: a saved tensor of the one dtype every weight has (an fp32 or fp64 run's
        # activations) is none of their casts, and is passed without walking its graph (Python, per saved tensor)
        dtypes = {t.dtype for t in weights.values()}
        self.only = next(iter(dtypes)) if len(dtypes) == 1 else None

    def pack(self, t: torch.Tensor):
        if t.layout != torch.strided:
            return t
        found = self.by_storage.get(t.untyped_storage().data_ptr())
        if found is not None:  # the weight, or a view such as its transpose, relative to the weight
            name, base = found
            return name, t.size(), t.stride(), t.storage_offset() - base, None
        name = self._cast_of(t)
        return t if name is None else (name, t.size(), t.stride(), t.storage_offset(), t.dtype)

    def _cast_of(self, t: torch.Tensor) -> str | None:
        """The weight ``t`` is a cast (or a view of a cast) of, laid out as that weight's storage cast; else None."""
        if t.dtype == self.only:
            return None
        fn, name = t.grad_fn, None
        for _ in range(self.HOPS):
            if fn is None:
                break
            name = self.by_node.get(fn) or self.by_leaf.get(id(getattr(fn, "variable", None)))
            if name is not None:
                break
            fn = fn.next_functions[0][0] if fn.next_functions else None
        if name is None or t.dtype == self.weights[name].dtype:
            return None
        try:  # the rebuild assumes this layout: checked once here, on the forward's own values
            same = self.weights[name].detach().to(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())
        except RuntimeError:
            return None
        return name if torch.equal(same, t) else None

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        name, size, stride, offset, dtype = packed
        if (name, dtype) not in self.cache:
            rebuilt = self.cache.get((name, None))
            rebuilt = self.rebuild(name) if rebuilt is None else rebuilt
            self.cache[(name, None)] = rebuilt
            self.cache[(name, dtype)] = rebuilt if dtype is None else rebuilt.to(dtype)
        rebuilt = self.cache[(name, dtype)]  # may itself sit at an offset in its storage (a parameter that is a view)
        return rebuilt.as_strided(size, stride, rebuilt.storage_offset() + offset)

    def context(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class StageWeights:
    """Makes the tensors one micro-batch's forward runs on; ``params`` maps names to the stage's parameters.

    ``micro``: micro-batches per update. SpecTrain's ⌊k/2⌋ term counts updates made during k/2 mini-batch
    slots; with ``micro`` micro-batches per update that is ⌊k/2⌋ // micro updates."""

    def __init__(self, params: dict[str, torch.nn.Parameter], optimizer, mode: str, stage: int, stages: int,
                 variant: Prediction | str = "v1", micro: int = 1, lr_of: Callable[[int], float] | None = None) -> None:
        if mode not in MODES:
            raise PlanError(f"weight mode '{mode}' is invalid; valid: {', '.join(MODES)}")
        variant = choices.prediction(variant)
        if mode == "predict":
            check_optimizer(optimizer)
        self.params, self.optimizer, self.mode, self.variant = params, optimizer, mode, variant
        self.extra = (stage // 2) // micro if variant.again_in_backward else 0
        self.updates = 0  # bumped by the engine after every optimizer step: names the weight version
        # update index (0: the engine's first) -> the LR it applies; None: the optimizer's current LR for all
        self.lr_of = lr_of
        self.made = 0  # weight copies made (stashed or predicted; each shared by the forwards of its key)
        self.log: list | None = None  # a list: ("F" | "B", updates done, s, shift) per prediction (tests)
        # the copy the forwards of one key share: the stash of a weight version, or Ŵ of a version and s (with m
        # micro-batches per update up to m - 1 forwards of a step predict the same Ŵ: stage 0 of 4 at m = 4 three)
        self._copy: tuple[tuple, dict[str, torch.Tensor]] | None = None

    def shift(self, s: int) -> float:
        """How far along the update direction the weights ``s`` updates from now are: the sum of those
        updates' LRs (under warm-up or decay each differs, and none need be the current one)."""
        if self.lr_of is None:
            return s * self.optimizer.param_groups[0]["lr"]
        return sum(self.lrs(s))

    def lrs(self, s: int) -> list[float]:
        """The LRs of the next ``s`` updates: each its mini-batch's (``lr_of``), else the optimizer's current one."""
        if self.lr_of is None:
            return [self.optimizer.param_groups[0]["lr"]] * s
        return [self.lr_of(self.updates + t) for t in range(s)]

    def _logged_shift(self, kind: str, s: int) -> float:
        shift = self.shift(s)
        if self.log is not None:
            self.log.append((kind, self.updates, s, shift))
        return shift

    def _predicted(self, name: str, base: torch.Tensor, shift: float, s: int) -> torch.Tensor:
        """Ŵ of ``name`` ``s`` updates ahead (``shift``: the sum of their LRs), on ``base`` (the live weight or a
        leaf sharing its storage): the gradient at Ŵ reaches ``base`` as it is (dŴ/dW taken as the identity)."""
        p = self.params[name]
        if self.variant.guess == "optimizer" and s:
            return torch.add(base, rolled(self.optimizer, p, self.lrs(s)) - p.detach())
        v = direction(self.optimizer, p)
        # always a new tensor, even when the shift or v is zero, so hooks can tell it from the live weight
        return torch.add(base, v, alpha=-shift) if v is not None and shift else base * 1

    def _backward_weight(self, name: str) -> torch.Tensor:
        live = self.params[name].detach()
        if not self.extra or self.variant.live_backward:
            return live
        return self._predicted(name, live, self._logged_shift("B", self.extra), self.extra)

    def make(self, ahead: int):
        """Weights for one micro-batch whose own update comes ``ahead`` updates from now.

        Returns (weights for functional_call, leaves whose .grad belongs to the parameters, autograd
        context, key of the weight copy the graph keeps or None), or None where the stage's live parameters
        are those weights: ``ahead`` 0 means no update comes before the micro-batch's backward, so without
        v1's extra term stale, stashed and predicted weights all equal the live ones, and the module runs on
        them as it is (a copy, ``functional_call`` and the gradients' second sum cost a stage's small ops up to
        a third of their time; docs/pipeline.md)."""
        if ahead == 0 and (self.mode != "predict" or self.extra == 0):
            self._copy = None  # a version's last copied forward has run: its copy is not kept past it
            return None
        if self.mode == "stash":
            # micro-batches that run on the same version share one copy (PipeDream-2BW keeps two)
            copy = self._once(("stash", self.updates), lambda: {n: p.detach().clone() for n, p in self.params.items()})
            leaves = {n: t.detach().requires_grad_(True) for n, t in copy.items()}
            return leaves, leaves, contextlib.nullcontext(), ("stash", self.updates)
        if self.mode == "stale":  # the backward multiplies by the weights live then (autocast's copies rebuilt)
            leaves = self._aliases()
            live = _RebuildSaved(leaves, lambda name: self.params[name].detach())
            return leaves, leaves, live.context(), None
        s = ahead + self.extra
        shift = self._logged_shift("F", s)
        if self.extra and not self.variant.live_backward:
            # v1's half-way term: the backward predicts weights of its own, so a Ŵ kept for the next forward would
            # be a second copy; each forward makes its own and the graph holds none of it (_RebuildSaved)
            leaves = self._aliases()
            weights = {n: self._predicted(n, leaf, shift, s) for n, leaf in leaves.items()}
            return weights, leaves, _RebuildSaved(weights, self._backward_weight).context(), None
        # Ŵ is a function of the update count, s and its shift, and the weights and optimizer state, which every
        # in-place change of a weight (an optimizer step, a checkpoint's load) marks in the version counters
        key = (self.updates, s, shift, *(p._version for p in self.params.values()))
        shared = self._once(key, lambda: {n: self._predicted(n, p.detach(), shift, s) for n, p in self.params.items()})
        # each forward's own leaves on the shared storage: their gradients are this micro-batch's, added to the
        # parameters' by the engine, as a leaf under a predicted copy would have passed them on unchanged
        leaves = {n: w.detach().requires_grad_(True) for n, w in shared.items()}
        if not (self.variant.again_in_backward or self.variant.live_backward):  # v2: the graphs keep this copy
            return leaves, leaves, contextlib.nullcontext(), (self.variant.name, *key)
        # v1 (no half-way term here) and opt: the backward multiplies by the live weights of its time
        return leaves, leaves, _RebuildSaved(leaves, self._backward_weight).context(), None

    def _aliases(self) -> dict[str, torch.Tensor]:
        """The parameters as leaves: ``.data`` shares the storage but not the version counter, so in-place updates
        do not trip autograd."""
        return {n: p.data.requires_grad_(True) for n, p in self.params.items()}

    def _once(self, key: tuple, make: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The weight copy of ``key``, made by ``make`` only when the key changes (the old copy dropped first)."""
        if self._copy is None or self._copy[0] != key:
            self._copy = None
            with torch.no_grad():
                self._copy = (key, make())
            self.made += 1
        return self._copy[1]
