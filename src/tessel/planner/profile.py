"""What the planner knows of a model before any worker starts: per-layer compute, parameters, boundary
activations and tables, measured once on the plain model on this machine's CPU.

Each layer of the registered chain is timed (forward + backward, one thread, as a worker runs) at two
micro-batch sizes, and a line ``a + b * samples`` through the two points prices every other size. A layer's
time under one of tessel's tensor-parallel grids is timed the same way on groups that stand in for the grid's
(:meth:`Profile.tp_seconds`): at these widths a rank's block costs more than its share of the FLOPs (small GEMMs,
the gathered blocks' copies, the norms and residual kept whole). Tables are surveyed on the dp-local batch of
each candidate dp (unique rows per rank) and on the global batch.

    >>> from tessel.config import load_config
    >>> from tessel.resolve import job_of
    >>> cfg = load_config(None, ["model.name=classifier", "model.layers=2", "model.hidden=64",
    ...                          "model.in_features=32", "model.classes=4"])
    >>> p = measure(job_of(cfg), sizes=(2, 8), dps=(1,))
    >>> [layer.name for layer in p.layers], p.layers[0].params
    (['net.0', 'net.2', 'net.4'], 2112)
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from .. import tensor
from ..chain import Runner, chain_of, recomputed
from ..meta import on_meta
from ..pipeline.layers import stage_params
from ..pipeline.partition import LayerCost, profile
from ..registry import spec_of
from ..settings import Settings
from ..sparse import find_tables
from ..sparse.detect import measure as measure_tables
from ..train.engine import Engine
from ..train.optim import build_optimizer
from ..train.tail import StepTail
from .job import Job
from .shards import TensorLayer, TensorShards, each_param, first_use

FORWARD_SHARE = 1 / 3  # where untimed: a linear's one matrix product forward against its two backward


@dataclass
class LayerProfile:
    name: str
    fixed: float  # seconds of forward + backward independent of the micro-batch size
    per_sample: float  # seconds per sample of the micro-batch
    params: int  # elements
    out_per_sample: int  # elements of the activation it hands on, per sample
    tables: tuple[str, ...] = ()  # the surveyed tables this layer owns
    linears: tuple = ()  # its tensor-parallel linears: (features in, out, up, channel, ends) (registered per model)
    measured: dict = field(default_factory=dict)  # samples -> seconds, where profiled
    saved_per_sample: float = 0.0  # bytes autograd keeps for its backward, per sample (weights not counted)
    work_per_sample: float = 0.0  # bytes its backward holds at once beyond those and its gradients, per sample
    ahead_per_sample: float = 0.0  # bytes its forward holds at once beyond what it saves and hands on, per sample
    selective_per_sample: float = 0.0  # bytes a selective recompute keeps (its matrix products' outputs), per sample
    # recompute kind -> {samples: the share of the layer's forward + backward time that recomputing adds there},
    # timed at the smallest profiled micro-batch and the global batch: a recompute costs a fixed time per call
    # beside its per-sample work, so its share falls as the micro-batch grows (an LSTM layer's 1.31 at 4 samples,
    # 0.65 at 32: docs/benchmarks.md, "A recompute's share at the micro-batch's size"); where not timed, the
    # kind's assumed share (a forward, a third). A tensor-parallel rank's block takes the plain layer's share at
    # the micro-batch's samples, though its fixed part weighs more at 1/tp of the work
    again: dict = field(default_factory=dict)
    # the share of its forward + backward spent in the forward (with the loss on the last layer), timed at the
    # global batch: GPipe runs every forward before any backward, so its phases are paced by different stages
    # (where not timed, a forward's usual third)
    forward_share: float = FORWARD_SHARE

    def seconds(self, samples: float) -> float:
        """Measured at this size, else on the line through the nearest measured sizes around it."""
        if samples in self.measured:
            return self.measured[samples]
        pts = sorted(self.measured.items())
        if len(pts) >= 2:
            lo = max((p for p in pts if p[0] <= samples), default=pts[0])
            hi = min((p for p in pts if p[0] > samples), default=pts[-1])
            if hi[0] != lo[0]:
                return max(lo[1] + (hi[1] - lo[1]) * (samples - lo[0]) / (hi[0] - lo[0]), 0.0)
        return max(self.fixed + self.per_sample * samples, 0.0)

    def again_at(self, kind: str, samples: float) -> float | None:
        """The share of the layer's time that recomputing it (``kind``) adds on a micro-batch of ``samples``: as
        timed at a timed size; between two, the seconds it adds on the line through theirs (each size's share of
        the layer's seconds there) over the layer's seconds; beyond them, the nearest's share. None: not timed.

            >>> shares = {"layers": {2: 1.0, 32: 0.5}}  # recomputing adds 1 s at 2 samples, 5 s at 32
            >>> layer = LayerProfile("h", 0.0, 0.0, 0, 0, measured={2: 1.0, 32: 10.0}, again=shares)
            >>> layer.again_at("layers", 2), round(layer.again_at("layers", 8), 6), layer.again_at("layers", 64)
            (1.0, 0.642857, 0.5)
        """
        shares = self.again.get(kind)
        if not shares:
            return None
        pts = sorted(shares.items())
        if samples in shares:
            return shares[samples]
        if samples < pts[0][0]:
            return pts[0][1]
        if samples > pts[-1][0]:
            return pts[-1][1]
        (a, share_a) = max(p for p in pts if p[0] < samples)
        (b, share_b) = min(p for p in pts if p[0] > samples)
        added_a, added_b = share_a * self.seconds(a), share_b * self.seconds(b)
        base = self.seconds(samples)
        added = added_a + (added_b - added_a) * (samples - a) / (b - a)
        return max(added, 0.0) / base if base > 0 else share_a


@dataclass
class TableProfile:
    name: str
    rows: int
    dim: int
    fed: bool  # ids come from the batch (the 2-D schedule can prefetch them)
    unique: dict[int, float] = field(default_factory=dict)  # dp -> unique rows one rank's batch touches
    ahead: int | None = None  # as TableInfo's: the batch tensor its ids begin with
    route_from: str | None = None  # as TableInfo's: the table read with the same ids before it


@dataclass
class Profile:
    layers: list[LayerProfile]
    tables: list[TableProfile]
    elem: int  # bytes per element (train.dtype)
    optimizer_per_elem: float  # seconds of the optimizer step per parameter element
    tokens_per_sample: int  # rows a sample feeds each linear (seq_len for the LMs, 1 for the classifier)
    seconds: float = 0.0  # how long measuring took
    step_factor: float = 1.0  # a real single-process training step's CPU time over the layers' and optimizer's sum
    job: Job | None = None  # what was measured (its model is rebuilt on the meta device for shard sizes)
    memory_samples: int = 0  # the micro-batch its layers' memory was measured at (0: not measured)
    # its layers ran under the run's autocast (bf16-mixed): their memory is what such a run holds (fp32 and bf16
    # tensors mixed, the weights' bf16 copies the products save), taken as measured; False: measured in the
    # parameters' dtype, and the estimate scales activations to the wire width
    autocast: bool = False
    # a core's seconds each micro-batch beyond the first adds to a one-process step beyond its layers (autograd
    # set-up, the loss, the engine's bookkeeping), timed at up to 16 micro-batches: the step factor, a ratio at the
    # global batch, misses it, as it is not in proportion to the micro-batch's size (0: not timed)
    per_micro: float = 0.0
    _shards: dict = field(default_factory=dict, repr=False)

    @property
    def params(self) -> int:
        """Parameter elements of the model, a tied weight once."""
        return sum(n for layer in first_use(self.param_sizes("1d", (1,))) for _, n in layer)

    def param_sizes(self, mode: str, grid: tuple[int, ...]) -> list[list[tuple[str, int]]]:
        """Per chain layer, (name, elements) of each parameter it uses that one rank holds under tensor parallelism
        (mode, grid; a grid of 1: the plain model; the tensor-parallel layers applied to a meta-device model, so
        replicated norms and biases count whole), a tied weight under the name of the first layer that uses it:
        what DDP cuts into buckets, and what a stage holds. Without a job, each layer as one parameter."""
        if self.job is None:
            return [[(f"#{i}", layer.params)] for i, layer in enumerate(self.layers)]
        if math.prod(grid) > 1:
            return self._shard(mode, grid).each
        if "plain sizes" not in self._shards:  # (tensor.apply refuses a model without a tensor-parallel form)
            model, chain = self._plain()
            self._shards["plain sizes"] = each_param(model, chain, len(self.layers))
        return self._shards["plain sizes"]

    def fsdp_calls(self, lo: int, hi: int) -> int:
        """Gathers FSDP makes of a stage of chain layers ``lo..hi`` per forward (as many again per backward, and
        reduce-scatters once a step): one per unit :func:`tessel.fsdp.units` cuts from those layers, and one for
        the stage's root where a weight stays with it (a tied one). Without a job, one per chain layer."""
        if self.job is None:
            return hi - lo
        key = ("fsdp calls", lo, hi)
        if key not in self._shards:
            from .. import fsdp  # (it imports torch's FSDP and DTensor, which nothing imports before a run needs)

            model, chain = self._plain()
            units = fsdp.units(model, [layer.owns for layer in chain.layers[lo:hi]])
            inside = {id(p) for m in units for p in m.parameters()}
            left = set(map(id, stage_params(model, chain, lo, hi).values())) - inside
            self._shards[key] = len(units) + bool(left)
        return self._shards[key]

    def _plain(self):
        """The plain model on the meta device and its chain, built once."""
        if "plain model" not in self._shards:
            with on_meta():
                model = self.job.build()
            self._shards["plain model"] = (model, chain_of(model))
        return self._shards["plain model"]

    def shard_out(self, mode: str, grid: tuple[int, ...]) -> list[float]:
        """Per chain layer, the share of its output one rank holds (its block in the layer's output layout):
        what crosses a stage boundary from that layer under tensor parallelism."""
        return self._shard(mode, grid).share

    def tp_layers(self, mode: str, grid: tuple[int, ...]) -> TensorShards:
        return self._shard(mode, grid)

    def tp_memory(self, mode: str, grid: tuple[int, ...], regather: bool) -> list[TensorLayer] | None:
        """Per chain layer, what one rank's forward saves and its backward holds under tensor parallelism (mode,
        grid, regather), measured by running the tensor-parallel layers on groups that stand in for the grid's
        (:class:`tessel.comm.Dry`): replicated norms and residuals whole, gathered blocks kept for backward,
        each as the run holds it. None where the layers' memory was not measured (or torch's peer cuts them)."""
        if not self.memory_samples:
            return None
        return self._dry(mode, grid, regather, timed=False)

    def tp_seconds(self, mode: str, grid: tuple[int, ...], regather: bool) -> list[TensorLayer] | None:
        """Per chain layer, one rank's forward and backward seconds under tensor parallelism, timed on the stand-in
        groups as the plain layers are timed (collectives move nothing there: the estimate prices them apart).
        None where the plain model was not profiled for time (or torch's peer cuts the layers)."""
        if not any(layer.measured for layer in self.layers):
            return None
        return self._dry(mode, grid, regather, timed=True)

    def _dry(self, mode: str, grid: tuple[int, ...], regather: bool, timed: bool) -> list[TensorLayer] | None:
        if self.job is None or tensor.GridSpec(mode, tuple(grid)).mode.torch_peer:
            return None
        key = ("timed" if timed else "memory", mode, tuple(grid), regather)
        if key not in self._shards:
            samples = self.memory_samples or self.job.settings.global_batch
            self._shards[key] = _dry_run(self.job, mode, tuple(grid), regather, samples, 3 if timed else 0)
        return self._shards[key]

    def _shard(self, mode: str, grid: tuple[int, ...]) -> TensorShards:
        key = (mode, tuple(grid))
        if key not in self._shards:
            with on_meta():
                model = self.job.build()
            chain = chain_of(model)
            tp_chain, handle = tensor.apply(model, chain, tensor.GridSpec(mode, tuple(grid)))
            rows = math.prod(grid)  # a sample count every row split divides
            out = TensorShards(handle.grid.sizes)
            out.each = each_param(model, chain, len(self.layers))
            for i, layer in enumerate(self.layers):
                params = stage_params(model, chain, i, i + 1)
                full = (rows, layer.out_per_sample)
                out.share.append(math.prod(tp_chain.local(i, full)) / math.prod(full))
                partial: dict[tuple[str, ...], int] = {}
                for p in params.values():
                    if p.tp_partial:
                        partial[p.tp_partial] = partial.get(p.tp_partial, 0) + p.numel()
                out.partial.append(partial)
                # norms and the token table (the linears are priced from the registered list); the loss on the last
                modules = [m for o in chain.layers[i].owns for m in model.get_submodule(o).modules()]
                out.traffic.append([m.traffic for m in modules if hasattr(m, "traffic")])
            if hasattr(tp_chain.loss, "traffic"):
                out.traffic[-1].append(tp_chain.loss.traffic)
            named = dict(model.named_parameters())
            for t in self.tables:  # a vocabulary shard's rows are cut over the grid; a whole table (sampled head) not
                split = getattr(named.get(f"{t.name}.weight"), "tp_split", None)
                axes = dict(split.dims).get(0, ()) if split is not None else ()
                out.table_parts[t.name] = math.prod(handle.grid.size(a) for a in axes)
            self._shards[key] = out
        return self._shards[key]


def _dry_run(job: Job, mode: str, grid: tuple[int, ...], regather: bool, samples: int, repeats: int
             ) -> list[TensorLayer]:
    """:meth:`Profile.tp_memory` (``repeats`` 0) and :meth:`Profile.tp_seconds`: the layers run at ``samples`` (the
    plain layers' micro-batch) and half of it, each made a multiple every row split divides: a line through two
    points far apart, since a layer's peak mixes constants (a weight's gradient) with what grows with the
    micro-batch (the logits and their softmax). Timed, a layer like one already timed (same modules, shapes,
    input) is taken to cost the same, so a stack of equal blocks is timed once per size."""
    unit = math.prod(grid)
    hi = -(-samples // unit) * unit
    lo = -(-(samples // 2) // unit) * unit
    lo, hi = (lo, hi) if lo < hi else (hi, hi + unit)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker runs, and as the plain layers were timed
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(job.settings.seed)
            with on_meta():  # each layer made real in turn as it runs (partition.profile), at both sizes
                model = job.build()
            chain, _ = tensor.apply(model, chain_of(model), tensor.GridSpec(mode, grid), regather=regather, dry=True)
            with job.settings.autocast():
                runs = [profile(model, chain, *job.batch(n, 1), repeats=repeats, memory=True, reuse=True)
                        for n in (lo, hi)]
    finally:
        torch.set_num_threads(threads)

    def line(a: float, b: float) -> tuple[float, float]:  # (at no sample, per sample) through both sizes
        return a - (b - a) * lo / (hi - lo), (b - a) / (hi - lo)

    def timed(a: float, b: float) -> tuple[float, float]:  # one size the machine slowed taken out (_steady)
        return line(*_steady({lo: a, hi: b}).values())

    return [TensorLayer(line(a.saved, b.saved), line(a.work, b.work), line(a.ahead, b.ahead),
                        timed(a.seconds, b.seconds)) for a, b in zip(*runs)]


def _optimizer_step(model: torch.nn.Module, settings: Settings):
    """A callable timing one optimizer step over ``model``'s parameters (CPU seconds); its first step, which
    allocates the state, is run here untimed."""
    params = list(model.parameters())
    opt = build_optimizer(params, settings)

    def step() -> float:
        for p in params:
            p.grad = torch.zeros_like(p)
        with torch.autocast(params[0].device.type, enabled=False):  # (timed among layers under the run's autocast;
            t0 = time.thread_time()  # a run's optimizer steps outside it)
            opt.step()
            seconds = time.thread_time() - t0
        model.zero_grad(set_to_none=True)
        return seconds
    step()
    return step


def _share(forward: float, seconds: float) -> float:
    """The forward's share of a timed forward + backward; the usual third where nothing was timed."""
    return min(max(forward / seconds, 0.0), 1.0) if seconds > 0 else FORWARD_SHARE


def measure(job: Job, sizes: tuple[int, ...] | None = None, dps: tuple[int, ...] = (1,)) -> Profile:
    """Profile ``job``'s model at every micro-batch size in ``sizes`` (default: 1 sample and the global batch;
    other sizes are priced on the line through the nearest two) and survey its tables on the dp-local batch of
    every dp in ``dps``."""
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker runs one thread (OMP_NUM_THREADS=1 in the launcher and the cluster)
    settings = job.settings
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            model = job.build()
            chain = chain_of(model)
            b = settings.global_batch
            sizes = sorted(set(sizes or (1, b)) | {b})
            x, y = job.batch(b, 1)
            with settings.autocast():  # timed and counted as the run computes (bf16 under mixed precision)
                micro = _many(b, sizes)
                costs, real, many = _rounds(model, chain, settings, x, y, sizes, micro)
                selective = _selective(model, chain, x, y)
                again = _recompute_shares(model, chain, x, y, (sizes[0], sizes[-1]))
            tables = _tables(job, model, dps)
            spec = spec_of(model)
            linears = spec.linears(model) if spec.linears else [[] for _ in chain.layers]
            layers = []
            for i, layer in enumerate(chain.layers):
                params = sum(p.numel() for p in stage_params(model, chain, i, i + 1).values())
                owns = tuple(t.name for t in tables if any(t.name == o or t.name.startswith(o + ".")
                                                           for o in layer.owns))
                points = _steady({n: c[i].seconds for n, c in costs.items()})
                small, large = sizes[0], sizes[-1]
                per = (points[large] - points[small]) / max(large - small, 1)
                top = costs[large][i]
                layers.append(LayerProfile(layer.name, points[small] - per * small, per, params,
                                           _numel(top.out_shape), owns, tuple(linears[i]), points,
                                           saved_per_sample=top.saved / large, work_per_sample=top.work / large,
                                           ahead_per_sample=top.ahead / large,
                                           selective_per_sample=selective[i] / large, again=again[i],
                                           forward_share=_share(top.forward, top.seconds)))
            tokens = x.shape[1] if x.dim() > 1 and not x.is_floating_point() else 1
            factor, opt = _step_factor(real, sum(p.numel() for p in model.parameters()))
    finally:
        torch.set_num_threads(threads)
    elem = next(model.parameters()).element_size()
    return Profile(layers, tables, elem, opt, tokens, time.perf_counter() - t_start, factor, job, b,
                   autocast=bool(settings.precision.compute), per_micro=_per_micro(real, many, micro))


def measure_memory(job: Job, samples: int) -> Profile:
    """Per chain layer, its parameters, output, and the bytes its forward saves and its backward holds at a
    micro-batch of ``samples`` (no timing): what :func:`tessel.planner.memory.stage_memory` needs, cheap
    enough for every run to predict its own peak."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.settings.seed)
        with on_meta():  # made one layer at a time as it is measured: never the whole model at once
            model = job.build()
        chain = chain_of(model)
        x, y = job.batch(samples, 1)
        with job.settings.autocast():  # counted as the run holds it (bf16 under mixed precision)
            costs = profile(model, chain, x, y, repeats=0, memory=True)
            selective = _selective(model, chain, x, y)
    tables = [TableProfile(i.name, i.rows, i.dim, False) for i in find_tables(model) if i.unsupported is None]
    layers = []
    for i, (c, layer) in enumerate(zip(costs, chain.layers)):
        owns = tuple(t.name for t in tables if any(t.name == o or t.name.startswith(o + ".") for o in layer.owns))
        layers.append(LayerProfile(c.name, 0.0, 0.0, sum(p.numel() for p in stage_params(model, chain, i, i + 1)
                                                          .values()), _numel(c.out_shape), owns,
                                   saved_per_sample=c.saved / samples, work_per_sample=c.work / samples,
                                   selective_per_sample=selective[i] / samples,
                                   ahead_per_sample=c.ahead / samples))
    tokens = x.shape[1] if x.dim() > 1 and not x.is_floating_point() else 1
    return Profile(layers, tables, next(model.parameters()).element_size(), 0.0, tokens, job=job,
                   memory_samples=samples, autocast=bool(job.settings.precision.compute))


def _selective(model, chain, x, y) -> list[int]:
    """Per chain layer, the bytes its forward keeps under selective recompute (no timing)."""
    return [c.kept for c in profile(model, recomputed(chain, model, keep_matmuls=True), x, y, repeats=0,
                                    memory=True)]


def _recompute_shares(model, chain, x, y, sizes: tuple[int, ...], rounds: int = 5) -> list[dict]:
    """Per chain layer, recompute kind -> {size: the share of the layer's time on a micro-batch of that many samples
    (the first of ``x``, ``y``) that running it recomputed adds}, at each of ``sizes`` (:func:`_shares_at`)."""
    kinds = {"none": chain, "layers": recomputed(chain, model),
             "selective": recomputed(chain, model, keep_matmuls=True)}
    at = {n: _shares_at(model, kinds, x[:n], y[:n], rounds) for n in dict.fromkeys(sizes)}
    return [{k: {n: shares[i][k] for n, shares in at.items()} for k in ("layers", "selective")}
            for i in range(len(chain.layers))]


def _shares_at(model, kinds: dict, x, y, rounds: int) -> list[dict]:
    """Per chain layer, recompute kind -> the share of the layer's time on this micro-batch that running it
    recomputed adds: the median over ``rounds`` of each round's ratio to that round's plain run. A round times the
    layers plain and under each kind in turn, one run each (the order reversed every other round; warmed in the
    first round only), so a ratio is taken within one of this machine's slow spells (seconds long, up to 1.9x)
    rather than across them, as each kind's fastest run was (docs/benchmarks.md, "The profile's recompute
    shares"). Equal layers (same modules, shapes, input) are timed as one."""
    ratios: dict[str, list[list[float]]] = {"layers": [], "selective": []}
    for r in range(rounds):
        secs = {}
        for kind in kinds if r % 2 == 0 else list(kinds)[::-1]:
            secs[kind] = [c.seconds for c in profile(model, kinds[kind], x, y, repeats=1, reuse=True, warm=r == 0)]
        for kind, per_round in ratios.items():
            per_round.append([t / base - 1 if base > 0 else 0.0 for t, base in zip(secs[kind], secs["none"])])
    # never cheaper for recomputing
    return [{k: max(statistics.median(rnd[i] for rnd in ratios[k]), 0.0) for k in ratios}
            for i in range(len(kinds["none"].layers))]


def _steady(points: dict[int, float]) -> dict[int, float]:
    """A layer's seconds per micro-batch size, with the slowdowns this machine adds to single runs taken out:
    a larger micro-batch never costs more per sample than a smaller one (the GEMMs only get more efficient),
    and never less in all than a smaller one. Without this, one size profiled while the machine was busy
    (2x at one size was seen) makes every plan at that size look twice as slow.

        >>> _steady({1: 1.0, 8: 4.0, 32: 40.0, 64: 30.0})
        {1: 1.0, 8: 4.0, 32: 16.0, 64: 30.0}
    """
    sizes = sorted(points)
    out = dict(points)
    for a, b in zip(sizes, sizes[1:]):
        out[b] = min(out[b], out[a] * b / a)
    for a, b in zip(reversed(sizes[:-1]), reversed(sizes[1:])):
        out[a] = min(out[a], out[b])
    return out


ROUNDS = 3  # the micro-batch sizes are timed in turn, this many times over


def _rounds(model, chain, settings: Settings, x, y, sizes: list[int], micro: int = 1
            ) -> tuple[dict[int, list], list[tuple[float, list[float], float]], list[tuple[float, float]]]:
    """(size -> the layers' costs, per round (a real step's CPU seconds, the layers' at the global batch just
    before it, an optimizer step's just after), per round (the real step's seconds in ``micro`` micro-batches, run
    right after the optimizer's, the layers' seconds at 1/micro of the batch in that round); the last empty where
    ``micro`` is 1).

    Every size is timed once a round, in turn (the order reversed every other round), and a layer's time at a
    size is the median over the rounds of each round's fastest run. This machine runs for seconds at a time up to
    1.9x slower (one LSTM layer timed 14 to 27 ms in profiles taken one after another), so a size timed in one
    burst can land in a slow spell while the others do not. The real step (engine, step tail, optimizer: what
    the layers leave out, autograd across layers, the loss, zeroing, the norm and clip) runs right after the
    global batch's layers in every round, and an optimizer step right after it, so each round's ratio of the
    two is taken within one spell."""
    b = sizes[-1]
    step, optimizer = _real_step(model, settings, x, y), _optimizer_step(model, settings)
    step_many = _real_step(model, settings, x, y, micro) if micro > 1 else None
    runs: dict[int, list] = {n: [] for n in sizes}
    real, many = [], []
    for r in range(ROUNDS):
        for n in sizes if r % 2 == 0 else sizes[::-1]:
            runs[n].append(profile(model, chain, x[:n], y[:n], repeats=1, memory=n == b and r == 0, pool=True,
                                   warm=r == 0))
            if n == b:
                real.append((step(), [c.seconds for c in runs[n][-1]], optimizer()))
                if step_many:
                    many.append(step_many())
    many = [(t, sum(c.seconds for c in per)) for t, per in zip(many, runs[b // micro])]
    return {n: [_median_run(per) for per in zip(*rounds)] for n, rounds in runs.items()}, real, many


def _many(b: int, sizes: list[int]) -> int:
    """The micro-batches a step is timed in for :func:`_per_micro`: the most, up to 16, that cut the global batch
    ``b`` into a profiled size (1: none does, as with ``measure``'s default sizes, 1 sample and a global batch
    over 16: planning passes every candidate's). The most, as what each adds is about a millisecond, inside a
    step's noise on this machine at a few micro-batches (bench/plan-micro/noise.txt)."""
    return next((m for m in range(16, 1, -1) if b % m == 0 and b // m in sizes), 1)


def _per_micro(real: list[tuple[float, list[float], float]], many: list[tuple[float, float]], micro: int) -> float:
    """A core's seconds each micro-batch beyond the first adds to a one-process step beyond its layers, from
    :func:`_rounds`: per round, the real step in ``micro`` micro-batches against its price at that round's step
    factor (``micro`` times its layers at 1/micro of the batch, and the optimizer), over ``micro`` - 1; the median
    of the rounds, at least 0. Each round's own factor, not the profile's median: the step in micro-batches runs
    in the same spell as that round's step and layers (see :func:`_rounds`).

        >>> # a step of 1 micro-batch: 1.0 s for 0.9 s of layers and 0.1 of optimizer (factor 1); in 4 micro-batches
        >>> # 1.2 s where its layers (0.2 s each) and optimizer price 0.9
        >>> round(_per_micro([(1.0, [0.5, 0.4], 0.1)] * 3, [(1.2, 0.2)] * 3, 4), 9)
        0.1
        >>> # rounds of 0.1, -0.1 and 0.2 s: their median; every round below 0: 0; one micro-batch: not timed
        >>> real = [(1.0, [0.5, 0.4], 0.1)] * 3
        >>> round(_per_micro(real, [(1.2, 0.2), (0.6, 0.2), (1.5, 0.2)], 4), 9), _per_micro(real, [(0.6, 0.2)] * 3, 4)
        (0.1, 0.0)
        >>> _per_micro([(1.0, [0.9], 0.1)], [], 1)
        0.0
    """
    if micro < 2 or not many:
        return 0.0
    per = []
    for (step, layers, opt), (step_many, layers_many) in zip(real, many):
        factor = step / max(sum(layers) + opt, 1e-9)
        per.append((step_many - factor * (micro * layers_many + opt)) / (micro - 1))
    return max(0.0, statistics.median(per))


def _step_factor(real: list[tuple[float, list[float], float]], params: int) -> tuple[float, float]:
    """(A real step's CPU time over its layers' and optimizer's, the median of the rounds' ratios; the optimizer's
    seconds per parameter element, the median over the rounds), from ``_rounds``' pairs. A real step does the
    layers' work and more (autograd glue, loss, clip): a ratio under 1 can only be a round the machine slowed,
    and it would scale every plan's compute down, so the factor is at least 1.

        >>> # three rounds: ratios 1.2, 1.3 and 0.9 (a slowed round's layers); optimizer steps 0.1, 0.1, 0.2 s
        >>> factor, opt = _step_factor([(1.2, [0.5, 0.4], 0.1), (2.6, [1.0, 0.9], 0.1), (0.9, [0.4, 0.4], 0.2)], 10)
        >>> round(factor, 9), round(opt, 9)
        (1.2, 0.01)
    """
    factor = statistics.median(step / max(sum(layers) + opt, 1e-9) for step, layers, opt in real)
    return max(1.0, factor), statistics.median(opt for _, _, opt in real) / max(params, 1)


def _median_run(costs: tuple[LayerCost, ...]) -> LayerCost:
    """One layer's cost over the rounds: the first round's (which counted its memory), with the time and the
    forward's share of the round whose time is the median."""
    mid = sorted(costs, key=lambda c: c.seconds)[(len(costs) - 1) // 2]
    return dataclasses.replace(costs[0], seconds=mid.seconds, forward=mid.forward)


def _real_step(model, settings: Settings, x, y, micro: int = 1):
    """A callable timing one real training step of a copy of the plain model in ``micro`` micro-batches (CPU
    seconds), under the run's autocast as the layers are; its first step, which makes the optimizer's state, is
    run here untimed."""
    model = copy.deepcopy(model)
    runner = Runner(model, chain_of(model))
    optimizer = build_optimizer(list(runner.parameters()), settings)
    engine = Engine(runner, StepTail(list(runner.parameters()), optimizer, settings.clip), micro, settings.lr_at,
                    autocast=settings.autocast)
    steps = iter(range(10**9))

    def step() -> float:
        # (the profile's layers run inside the run's autocast; a run's step tail and optimizer do not)
        with torch.autocast(x.device.type, enabled=False):
            t0 = time.thread_time()
            engine.step(x, y, next(steps))
            return time.thread_time() - t0
    step()
    return step


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _tables(job: Job, model, dps: tuple[int, ...]) -> list[TableProfile]:
    # (a weight shared with another module, the token table tied to the head, stays dense at run time: every row
    # gets a gradient, tessel.sparse.plan.forced; so it is no table to price)
    infos = [i for i in find_tables(model) if i.unsupported is None and not i.shared_with]
    out = {i.name: TableProfile(i.name, i.rows, i.dim, False) for i in infos}
    b = job.settings.global_batch
    for dp in sorted(set(dps) | {1}):
        if not infos or b % dp:
            continue
        measure_tables(model, infos, [job.batch(b, dp)])
        for i in infos:
            out[i.name].unique[dp] = i.unique_per_step
            out[i.name].fed, out[i.name].ahead, out[i.name].route_from = i.fed, i.ahead, i.route_from
    return list(out.values())
