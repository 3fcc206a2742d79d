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

import math
import time
from dataclasses import dataclass, field

import torch

from .. import tensor
from ..chain import chain_of, recomputed
from ..meta import on_meta
from ..pipeline.layers import stage_params
from ..pipeline.partition import profile
from ..registry import spec_of
from ..sparse import find_tables
from ..sparse.detect import measure as measure_tables
from . import timing
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

    def timed(a: float, b: float) -> tuple[float, float]:  # one size the machine slowed taken out (timing.steady)
        return line(*timing.steady({lo: a, hi: b}).values())

    return [TensorLayer(line(a.saved, b.saved), line(a.work, b.work), line(a.ahead, b.ahead),
                        timed(a.seconds, b.seconds)) for a, b in zip(*runs)]


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
                micro = timing.micro_batches_for(b, sizes)
                costs, real, many = timing.layers_and_steps(model, chain, settings, x, y, sizes, micro)
                selective = _selective(model, chain, x, y)
                again = timing.recompute_shares(model, chain, x, y, (sizes[0], sizes[-1]))
            tables = _tables(job, model, dps)
            spec = spec_of(model)
            linears = spec.linears(model) if spec.linears else [[] for _ in chain.layers]
            layers = []
            for i, layer in enumerate(chain.layers):
                params = sum(p.numel() for p in stage_params(model, chain, i, i + 1).values())
                owns = tuple(t.name for t in tables if any(t.name == o or t.name.startswith(o + ".")
                                                           for o in layer.owns))
                points = timing.steady({n: c[i].seconds for n, c in costs.items()})
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
            factor, opt = timing.step_factor(real, sum(p.numel() for p in model.parameters()))
    finally:
        torch.set_num_threads(threads)
    elem = next(model.parameters()).element_size()
    return Profile(layers, tables, elem, opt, tokens, time.perf_counter() - t_start, factor, job, b,
                   autocast=bool(settings.precision.compute), per_micro=timing.per_micro(real, many, micro))


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
