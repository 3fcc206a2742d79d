"""Cut a layer chain into balanced stages: profile each layer, then the dynamic program PipeDream uses.

Each layer's forward+backward time is measured on one micro-batch (the fastest of several runs after a
warm-up, as timeit advises: interference only ever adds time); on CPU the clock is this thread's CPU time,
which other processes and a host's CPU quota do not inflate. Equal layers (same modules, shapes and input)
then take the median of their times: measured one after another, they differ only by the machine's drift, and
a cut should not follow it. The split minimises the slowest stage over all contiguous cuts. A given split
(layer counts per stage, torchgpipe's ``balance``) skips the search but is profiled and printed the same way.

Example::

    >>> import torch
    >>> from tessel.models import DenseClassifier
    >>> from tessel.pipeline.layers import chain_of
    >>> m = DenseClassifier(in_features=8, hidden=16, layers=3, classes=4)
    >>> costs = profile(m, chain_of(m), torch.randn(4, 8), torch.randint(0, 4, (4,)), repeats=1)
    >>> balance([1.0, 1.0, 1.0, 3.0], 2)
    [(0, 3), (3, 4)]
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import PlanError
from ..train.memory import PeakTensors, SavedBytes
from .layers import Chain, stage_params


@dataclass
class LayerCost:
    name: str
    seconds: float  # forward + backward of one micro-batch
    param_bytes: int
    out_shape: tuple[int, ...]  # the activation it hands on, without the batch dimension
    out_dtype: str
    out_bytes: int  # per micro-batch
    saved: int = 0  # bytes autograd keeps for the layer's backward (weights not counted), per micro-batch
    work: int = 0  # bytes its backward holds at once beyond those and its gradients (the peak's transients)
    kept: int = 0  # bytes alive after its forward beyond its input, weights and output, however kept (autograd's
    #                saved tensors, or what a recompute keeps: a selective one its matrix products' outputs)
    ahead: int = 0  # bytes its forward (and loss) holds at once beyond what it saves and hands on (a fused
    #                 loss's logits, made and dropped in the forward)
    forward: float = 0.0  # of ``seconds``, the forward's (with the loss on the last layer): GPipe runs them apart


@dataclass
class StagePlan:
    bounds: list[tuple[int, int]]  # [lo, hi) layer indices per stage
    costs: list[LayerCost]
    given: bool  # the split came from the user, not the search

    def stage_seconds(self) -> list[float]:
        return [sum(c.seconds for c in self.costs[lo:hi]) for lo, hi in self.bounds]

    def imbalance(self) -> float:
        """Slowest stage over the mean stage: 1.0 is perfect balance."""
        t = self.stage_seconds()
        return max(t) / (sum(t) / len(t)) if sum(t) else 1.0  # (untimed: a model on the meta device)

    def boundary(self, stage: int) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape (without the batch dimension) and dtype of what ``stage`` sends to the next stage."""
        c = self.costs[self.bounds[stage][1] - 1]
        return c.out_shape, getattr(torch, c.out_dtype)

    def describe(self) -> str:
        t = self.stage_seconds()
        how = "given split" if self.given else "balanced by profile (min-max dynamic program)"
        timed = f"slowest stage {self.imbalance():.2f}x the mean" if sum(t) else "not timed (built on the meta device)"
        rows = [f"pipeline plan: {len(self.bounds)} stages, {how}; {timed}",
                f"  {'stage':>5}  {'layers':<28} {'fwd+bwd ms':>10} {'params MB':>9} {'sends KB':>8}"]
        for s, (lo, hi) in enumerate(self.bounds):
            names = self.costs[lo].name + (f" .. {self.costs[hi - 1].name}" if hi - lo > 1 else "")
            mb = sum(c.param_bytes for c in self.costs[lo:hi]) / 2**20
            out = self.costs[hi - 1].out_bytes / 1024 if s + 1 < len(self.bounds) else 0.0
            rows.append(f"  {s:>5}  {names:<28} {t[s] * 1e3:>10.2f} {mb:>9.2f} {out:>8.1f}")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        return {"bounds": [list(b) for b in self.bounds], "given": self.given,
                "costs": [c.__dict__ for c in self.costs]}

    @classmethod
    def from_dict(cls, d: dict) -> StagePlan:
        costs = [LayerCost(**{**c, "out_shape": tuple(c["out_shape"])}) for c in d["costs"]]
        return cls([tuple(b) for b in d["bounds"]], costs, d["given"])


@contextlib.contextmanager
def _made(model: nn.Module, chain: Chain, i: int):
    """Layer ``i``'s weights given storage while it runs (random values: only their sizes count), back on the meta
    device after: a model built there is measured one layer at a time, never held whole."""
    swapped = []
    for name, p in stage_params(model, chain, i, i + 1).items():
        if p.is_meta:
            path, _, leaf = name.rpartition(".")
            owner = model.get_submodule(path)
            owner._parameters[leaf] = nn.Parameter(torch.randn(p.shape, dtype=p.dtype) * 0.02, p.requires_grad)
            swapped.append((owner, leaf, p))
    try:
        yield
    finally:
        for owner, leaf, p in swapped:
            owner._parameters[leaf] = p


def profile(model: nn.Module, chain: Chain, x: torch.Tensor, y: torch.Tensor, repeats: int = 5,
            memory: bool = False, reuse: bool = False, pool: bool = False, warm: bool = True) -> list[LayerCost]:
    """Time each layer's forward and backward on the micro-batch ``x`` (targets ``y``), one layer at a time;
    with ``memory``, also count what its forward saves and its backward holds (the planner's memory column).
    A model on the meta device is run for its shapes only, or with ``memory`` one layer made real at a time.
    With ``reuse`` (always when only counting memory), a layer like one already run (same modules, shapes,
    input) is taken to cost what that one did instead of being run again. With ``pool``, every layer is run and
    equal layers are given the median of their times: timed one after another they differ by the machine's
    drift alone (up to 2x between equal blocks here), and a cut between them would follow that noise. Without
    ``warm`` (layers already run at this size) the untimed first run is left out, and with it the memory
    counts and the saved bytes (0)."""
    costs = []
    clock = time.perf_counter if x.is_cuda else time.thread_time
    on_meta = any(p.is_meta for p in model.parameters())
    for module in model.modules() if on_meta else ():  # buffers are small: made whole (zeros: only sizes count)
        for name, b in module._buffers.items():
            if b is not None and b.is_meta:
                module._buffers[name] = torch.zeros(b.shape, dtype=b.dtype)
    runs: dict = {}  # a layer like one already measured (same modules, shapes, input) holds and costs the same
    keys: list = []  # each run layer's (for ``pool``)
    for i in range(len(chain.layers)):
        key = _signature(model, chain, i, x) if repeats == 0 or reuse or pool else None
        if key is not None and key in runs and not pool:
            costs.append(_Run(dataclasses.replace(runs[key].cost, name=chain.layers[i].name), runs[key].out))
        else:
            with _made(model, chain, i) if on_meta and memory else contextlib.nullcontext():
                costs.append(_layer(model, chain, i, x, y, repeats, memory, on_meta and not memory, clock, warm))
            runs[key] = costs[-1]
            keys.append(key)
        x = costs[-1].out
    return _pooled([c.cost for c in costs], keys) if pool else [c.cost for c in costs]


def _pooled(costs: list[LayerCost], keys: list) -> list[LayerCost]:
    """Each layer's seconds (and its forward's) replaced by the median over the layers of its key (equal modules,
    shapes, input)."""
    groups: dict = {}
    for cost, key in zip(costs, keys):
        groups.setdefault(key, []).append(cost)
    return [dataclasses.replace(cost, seconds=statistics.median(c.seconds for c in groups[key]),
                                forward=statistics.median(c.forward for c in groups[key]))
            for cost, key in zip(costs, keys)]


def _signature(model: nn.Module, chain: Chain, i: int, x: torch.Tensor) -> tuple:
    """What a layer's memory and time depend on: its modules' kinds and parameter shapes, its input's, whether a
    gradient is taken for its input (not for the first layer's: data), and whether the loss follows it (a model
    of many equal blocks is measured once per kind of block)."""
    if i + 1 == len(chain.layers):
        return ("loss",)
    mods = tuple((type(m).__name__, tuple((n, tuple(p.shape), p.dtype) for n, p in m.named_parameters()))
                 for o in chain.layers[i].owns for m in model.get_submodule(o).modules())
    return mods, tuple(x.shape), x.dtype, i == 0


@dataclass
class _Run:
    cost: LayerCost
    out: torch.Tensor  # the layer's output: the next layer's input


def _layer(model: nn.Module, chain: Chain, i: int, x: torch.Tensor, y: torch.Tensor, repeats: int, memory: bool,
           shapes_only: bool, clock, warm: bool = True) -> _Run:
    """Layer ``i`` of ``chain`` profiled on its input ``x`` (see :func:`profile`)."""
    layer = chain.layers[i]
    last = i + 1 == len(chain.layers)
    # the first layer's input is data: no gradient is computed for it in training either
    inp = x.detach().requires_grad_(i > 0 and x.is_floating_point())
    times: list[float] = []
    # an untimed first run warms allocator and kernels up; fast layers get more runs (20 ms of them at least)
    params = sum(p.numel() * p.element_size() for p in stage_params(model, chain, i, i + 1).values())
    if shapes_only:  # a model built on the meta device (tessel.materialize): its shapes, nothing to time
        with torch.no_grad():
            out = layer.run(model, inp.to("meta"))
        return _Run(LayerCost(layer.name, 0.0, params, tuple(out.shape[1:]), str(out.dtype).removeprefix("torch."),
                              out.numel() * out.element_size()), out)
    model.zero_grad(set_to_none=True)
    saved_bytes = work = kept = ahead = 0
    if warm or memory or not repeats:
        saved_bytes, work, kept, ahead, out = _first_run(model, chain, i, inp, y, memory, params)
    forwards: list[float] = []
    while repeats and (len(times) < repeats or (sum(times) < 0.02 and len(times) < 50)):  # (0: memory only)
        t0 = clock()
        out = layer.run(model, inp)
        loss = chain.loss(out, y) if last else (out * torch.ones_like(out)).sum()
        if out.is_cuda:
            torch.cuda.synchronize()
        forwards.append(clock() - t0)
        loss.backward()
        if out.is_cuda:
            torch.cuda.synchronize()
        times.append(clock() - t0)
    model.zero_grad(set_to_none=True)
    best = min(range(len(times)), key=times.__getitem__, default=None)  # the least disturbed run, both its parts
    return _Run(LayerCost(layer.name, times[best] if times else 0.0, params, tuple(out.shape[1:]),
                          str(out.dtype).removeprefix("torch."), out.numel() * out.element_size(),
                          saved_bytes, work, max(kept, 0), ahead, forwards[best] if times else 0.0), out.detach())


def _first_run(model: nn.Module, chain: Chain, i: int, inp: torch.Tensor, y: torch.Tensor, memory: bool,
               params: int) -> tuple[int, int, int, int, torch.Tensor]:
    """Layer ``i``'s untimed first run, which warms allocator and kernels up and counts its memory: (bytes its
    forward saves, its backward's transients, what the forward kept beyond its output, the forward's transients,
    its output)."""
    layer, last = chain.layers[i], i + 1 == len(chain.layers)
    known = [*model.parameters(), *model.buffers(), inp, y]  # all its operations start from
    with (PeakTensors(known) if memory else contextlib.nullcontext()) as peak, \
            SavedBytes(model.parameters()) as saved:
        out = layer.run(model, inp)
        kept = peak.live - peak.entry - out.numel() * out.element_size() if memory else 0
        loss = chain.loss(out, y) if last else (out * torch.ones_like(out)).sum()
        ahead = peak.bytes - peak.entry if memory else 0  # the most its forward (and loss) added at once
        if memory:  # from here the backward's own peak
            peak.restart()
        loss.backward()
    made = peak.bytes - peak.entry if memory else 0  # the most the layer's backward held at once
    size = out.numel() * out.element_size()
    # beyond what it saves: the backward's transients (its gradients, ``params``, are counted apart) and the
    # forward's apart (a fused loss makes its weight's gradient, a saved tensor, in the forward, beside the
    # logits it drops there; no gradient exists yet then). Less ``size``: in the backward, the output this
    # profile holds on to (the next layer's input; a run frees the last layer's once the loss has it); in the
    # forward, the stand-in loss's ones, where there is one (the last layer's output is alive while the loss
    # runs: unfused logits, (rows, classes), are a step's largest tensor)
    work = max(made - saved.bytes - params - size, 0)
    return saved.bytes, work, kept, max(ahead - saved.bytes - (0 if last else size), 0), out


def balance(seconds: list[float], stages: int) -> list[tuple[int, int]]:
    """Contiguous cut of ``seconds`` into ``stages`` non-empty parts that minimises the largest part's sum."""
    n = len(seconds)
    if not 1 <= stages <= n:
        raise PlanError(f"cannot cut {n} layers into {stages} pipeline stages; valid: pp between 1 and {n}")
    prefix = [0.0]
    for s in seconds:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # best[k][j]: the slowest stage when the first j layers form k stages; cut[k][j] where the last begins
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    bounds, j = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return bounds[::-1]


def parse_split(split: str, n_layers: int, stages: int, names: list[str]) -> list[tuple[int, int]]:
    """``"2,3,3"``: layer counts per stage, first to last."""
    try:
        counts = [int(c) for c in split.split(",")]
    except ValueError:
        counts = []
    if len(counts) != stages or any(c < 1 for c in counts) or sum(counts) != n_layers:
        raise PlanError(f"pipeline.split '{split}' is invalid: it needs {stages} positive layer counts summing to "
                        f"{n_layers} (the layers are {', '.join(names)}); e.g. '"
                        + ",".join(str(c) for c in _even(n_layers, stages)) + "'")
    bounds, lo = [], 0
    for c in counts:
        bounds.append((lo, lo + c))
        lo += c
    return bounds


def split_text(bounds) -> str:
    """``bounds`` as ``pipeline.split`` takes them: layer counts per stage.

    >>> split_text([(0, 2), (2, 3), (3, 6)])
    '2,1,3'
    """
    return ",".join(str(hi - lo) for lo, hi in bounds)


def _even(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)] if 1 <= k <= n else [n]


def plan_stages(model: nn.Module, chain: Chain, x: torch.Tensor, y: torch.Tensor, stages: int,
                split: str = "") -> StagePlan:
    """Profile ``chain`` on the micro-batch ``(x, y)`` and cut it into ``stages`` stages (or as ``split`` says)."""
    names = [layer.name for layer in chain.layers]
    costs = profile(model, chain, x, y, pool=True)
    if split:
        return StagePlan(parse_split(split, len(names), stages, names), costs, given=True)
    return StagePlan(balance([c.seconds for c in costs], stages), costs, given=False)
