"""Predicted step time, bytes per channel and memory per rank of one candidate plan.

One vocabulary of estimate for every axis: a step is compute + exposed communication + bubble (seconds),
plus bytes one rank sends per step on each channel and the bytes a rank holds. The byte formulas are
those of :mod:`tessel.comm` (an all-reduce over P ranks sends 2(P-1)/P of the tensor, a point-to-point
send its size):

    dp.dense  2(dp-1)/dp · (parameters of the stage's tp shard, tables served by rows excluded) · elem (2: bf16, asked)
    pp        micro-batches · (boundary activations out + gradients back, this rank's tp block) · elem
    tp        micro-batches · Σ linears of the stage (tessel.tensor.cost.linear_traffic) · elem
    tp.head   the head's linear (1-D/2-D/3-D), per micro-batch (last stage)
    tp.loss   the vocabulary-parallel loss's per-row max, sum and target logit (fp32), per micro-batch (last stage)
    tp.embed  the token table's gathers, reduce-scatters or all-reduce, per micro-batch (first stage)
    tp.norm   LayerNorms over features cut by the grid, per micro-batch
    tp.grads  once per step: row-replicated pieces' gradients summed, and the fp64 squared norm

Time per micro-batch on stage k is its layers' compute (a tensor-parallel rank's block as timed on stand-in groups;
torch's peer's as the plain layer's over tp), over the rank's compute speed, plus what the
runtime adds per micro-batch where a calibration trial measured it (:mod:`.calibrate`), plus
its tp collectives, or its boundary sends at the rate of the pp group (:class:`Topology`) where those take
longer: sends are asynchronous and travel while the stage computes. A flushed schedule takes one slot of every
stage (the first micro-batch's way through) and m - 1 slowest-stage slots, plus one activation's and
gradient's trip over every boundary (GPipe: each of its two phases so, a forward slot and a backward one, since
it runs every forward before any backward); an asynchronous one m slowest slots (no flush: the bubble is only the
imbalance); DDP all-reduces the gradients bucket by bucket, each paying the ring's latency, and hides them behind
backward up to the last bucket, as far as the topology's measured overlap lets it; a pipeline's gradient sync, the
tp gradient sums and the optimizer step follow the micro-batches. Tables served by rows are priced by the
sparse cost model (tessel.sparse.cost) with the surveyed unique rows and added as exposed time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import buckets, choices
from ..pipeline.partition import balance
from ..plan import ParallelPlan
from ..settings import Settings
from ..sparse.cost import Link, Sparsity
from ..sparse.cost import estimate as table_estimate
from ..sparse.plan import AUTO_OPTIONS, follows
from ..tensor.cost import grad_sum_traffic, linear_traffic, norm_sum_traffic
from .profile import Profile
from .span import pipeline
from .topology import Topology

if TYPE_CHECKING:
    from ..sparse.served import TableUse



@dataclass
class Estimate:
    plan: ParallelPlan
    compute: float  # seconds of the slowest stage's compute in a step
    comm: float  # exposed communication seconds
    bubble: float  # seconds a stage idles (flush, imbalance)
    bytes: dict[str, float] = field(default_factory=dict)  # channel -> bytes the busiest rank sends per step
    memory: float = 0.0  # bytes of tensors the fullest rank holds
    tables: dict[str, str] = field(default_factory=dict)  # table -> the strategy the cost model picks
    held: float = 0.0  # bytes beside its tensors that grow with the plan (FSDP's units; Topology.unit_memory)

    @property
    def step(self) -> float:
        return self.compute + self.comm + self.bubble

    @property
    def needs(self) -> float:
        """Bytes the fullest rank needs of its memory budget: its tensors and what the plan adds beside them."""
        return self.memory + self.held


def _ring(size: int, n: float) -> float:
    return 2 * (size - 1) / size * n if size > 1 else 0.0


def _strides(plan: ParallelPlan) -> dict[str, tuple[int, int]]:
    """mesh dim -> (size, stride) (tessel.mesh.ParallelDims.strides)."""
    return plan.dims.strides()


def _tp_axes(plan: ParallelPlan) -> dict[str, tuple[int, int]]:
    """grid axis -> (size, stride) inside the tp dim (the last grid axis holds consecutive ranks)."""
    if plan.tp == 1 or not plan.tp_mode.needs_grid:
        return {"tp": (plan.tp, 1)}
    out, stride = {}, 1
    for name, size in reversed(list(zip(plan.tp_mode.axes, plan.tp_grid))):
        out[name] = (size, stride)
        stride *= size
    return out


def _out_share(profile: Profile, plan: ParallelPlan) -> list[float]:
    """Per layer, the share of its output one rank sends across a stage boundary (its tp block)."""
    if plan.tp == 1:
        return [1.0] * len(profile.layers)
    return profile.shard_out(plan.tp_mode, plan.tp_grid)


# channels that carry fp32 whatever the compute dtype: norm and loss statistics (and gradient sums, priced on
# their own)
FULL_WIDTH = ("tp.norm", "tp.loss")


def _width(channel: str, profile: Profile, wire: int) -> int:
    """Bytes per element a tensor-parallel channel carries: activations and GEMM partial sums at the wire width
    (bf16 under mixed precision), norm and loss statistics at the parameters' (tessel.tensor.ops, on widths)."""
    return profile.elem if channel in FULL_WIDTH else wire


def _tp_traffic(plan: ParallelPlan, profile: Profile, layers: range, rows: float, topo: Topology, wire: int
                ) -> tuple[dict[str, float], float]:
    """(channel -> elements this rank sends, seconds) for one micro-batch of ``rows`` tokens through ``layers``:
    the linears (``tp``, the head's on ``tp.head``), the norms over split features, the token table, the loss
    (``tp.loss``)."""
    if plan.tp == 1:
        return {}, 0.0
    shards = profile.tp_layers(plan.tp_mode, plan.tp_grid)
    live = plan.live_backward  # weights gathered again in backward
    again = plan.recompute.layers  # a recomputed layer's forward collectives run again in its backward
    elems: dict[str, float] = {}
    seconds = 0.0
    for i in layers:
        # the first layer's input is data: no gradient of it is reduced
        moved = [(channel, *t) for h, h2, up, channel, ends in profile.layers[i].linears
                 for t in linear_traffic(plan.tp_mode, plan.tp_grid, rows, h, h2, up, plan.regather, i > 0, live,
                                         again, ends)]
        moved += [t for traffic in shards.traffic[i] for t in traffic(rows, again)]
        seconds += _tally(plan, profile, topo, moved, elems, lambda ch: _width(ch, profile, wire))
    return elems, seconds


def _tp_step(plan: ParallelPlan, profile: Profile, layers: range, topo: Topology) -> tuple[float, float]:
    """(bytes, seconds) this rank sends once per step on ``tp.grads``: the row-replicated pieces' gradients
    summed over their axes, and the squared norm (one fp64 element) over the whole grid."""
    if plan.tp == 1:
        return 0.0, 0.0
    shards = profile.tp_layers(plan.tp_mode, plan.tp_grid)
    partial: dict[tuple[str, ...], int] = {}
    for i in layers:
        for axes, n in shards.partial[i].items():
            partial[axes] = partial.get(axes, 0) + n
    elems: dict[str, float] = {}
    seconds = _tally(plan, profile, topo, [("tp.grads", *t) for t in grad_sum_traffic(partial, shards.sizes)],
                     elems, lambda ch: profile.elem)
    seconds += _tally(plan, profile, topo, [("tp.norm2", *t) for t in norm_sum_traffic(shards.sizes)], elems,
                      lambda ch: 8)
    return elems.get("tp.grads", 0.0) * profile.elem + elems.get("tp.norm2", 0.0) * 8, seconds


def _tally(plan: ParallelPlan, profile: Profile, topo: Topology, moved, elems: dict[str, float], width) -> float:
    """Add ``moved`` [(channel, grid axis, elements, ring steps)] to ``elems``; returns their seconds on ``topo``
    (``width``: channel -> bytes per element)."""
    axes, (tp_size, tp_stride) = _tp_axes(plan), _strides(plan)["tp"]
    seconds = 0.0
    for channel, axis, e, steps in moved:
        size, stride = axes.get(axis, (tp_size, 1))
        elems[channel] = elems.get(channel, 0.0) + e
        seconds += e * width(channel) / topo.group_rate(size, stride * tp_stride) + steps * topo.latency
    return seconds


def _tables(plan: ParallelPlan, profile: Profile, topo: Topology, compute: float, wire: int, settings: Settings
            ) -> tuple[dict[str, str], float, float, set[str]]:
    """(table -> strategy, bytes per step, exposed seconds, tables taken out of the dense sync)."""
    policy = plan.sparse
    if plan.dp == 1 or not plan.serves_tables or not (policy.strategy.served or policy.strategy.decides):
        return {}, 0.0, 0.0, set()
    if not policy.row_kind(settings.optimizer):  # no row optimizer mirrors the run's: its tables stay dense
        return {}, 0.0, 0.0, set()
    size, stride = _strides(plan)["dp"]
    link = Link(rate=topo.group_rate(size, stride), latency=topo.latency * 2 * (size - 1), per_elem=2e-9,
                source="topology")
    allowed = AUTO_OPTIONS if policy.strategy.decides else (policy.strategy.builds,)
    hosts = max(1, min(plan.dp, topo.hosts))
    picks, nbytes, seconds, served, picked = {}, 0.0, 0.0, set(), {}
    for t in profile.tables:
        k = t.unique.get(plan.dp)
        if k is None or t.unique.get(1) is None:
            continue
        parts = _table_parts(profile, plan, t.name)  # a 1-D vocabulary shard holds 1/tp of the rows
        s = Sparsity(t.rows // parts, t.dim, profile.elem, k / parts, t.unique[1] / parts,
                     min(t.unique[1], k * plan.dp / hosts) / parts, 0.5, t.fed and parts == 1, wire,
                     parts == 1 and follows(t, picked, policy.schedule, policy.prefetch_all))
        est = table_estimate(s, plan.dp, hosts, link, compute, policy.schedule)
        est = {o: e for o, e in est.items() if o.split("/")[0] in allowed}
        if not est or (policy.strategy.decides and k / max(t.rows, 1) > policy.max_touched):
            continue
        choice = min(est, key=lambda o: est[o].time)  # the cost model's option: dense, ps, ..., alltoall/column
        picked[t.name] = (choice, t)
        if not choices.table_strategy(choice.split("/")[0]).served:
            continue
        picks[t.name], served = choice, served | {t.name}
        nbytes += est[choice].bytes / max(topo.per_host, 1)
        seconds += est[choice].time
    return picks, nbytes, seconds, served


def estimate(plan: ParallelPlan, settings: Settings, profile: Profile, topo: Topology) -> Estimate:
    """The step a plan should take on ``topo`` (bounds filled in by the min-max cut if the plan has none)."""
    m, b = plan.micro_batches, settings.global_batch
    wire = settings.wire_dtype.itemsize  # activations, boundaries, looked-up rows (bf16 under mixed precision)
    samples = b / (plan.dp * m)  # per micro-batch on a dp rank
    rows = samples * profile.tokens_per_sample
    # the layers' profile times the measured ratio of a real step to it (autograd glue, loss, norm, clip)
    # (under recompute each layer's forward runs again in its backward: what that added where the profile timed
    # it, else the kind's assumed share)
    r = plan.recompute
    base = [t * profile.step_factor / topo.speed for t in _layer_seconds(plan, profile, samples)]
    per_layer = [t * (1 + (layer.again.get(r.name, r.again) if r.layers else 0.0))
                 for t, layer in zip(base, profile.layers)]
    # the forward's part (a recompute runs it again inside the backward, which holds that)
    forward = [t * layer.forward_share for t, layer in zip(base, profile.layers)]
    bounds = plan.bounds or tuple(balance(per_layer, plan.pieces)) if plan.pp > 1 else ((0, len(per_layer)),)
    if plan.pp > 1 and not plan.bounds:
        plan = plan.with_(bounds=tuple(tuple(x) for x in bounds))
    strides = _strides(plan)
    pp_rate = topo.group_rate(*strides["pp"])
    share = _out_share(profile, plan)
    stage_compute, stage_work, stage_send, tp_elems, pp_elems, tp_step, hops = [], [], [], [], [], [], []
    stage_forward = []  # per stage: the forward's part of its compute (``c`` below)
    # what the runtime adds to each micro-batch on a stage beyond its layers (a calibration trial's per_micro): a
    # pipeline stage pays it for every micro-batch; one process's step already holds the first in step_factor
    runtime = topo.per_micro * (1.0 if plan.pp > 1 else (m - 1) / m)
    for k, (lo, hi) in enumerate(bounds):
        c = sum(per_layer[lo:hi]) + runtime
        e_tp, s_tp = _tp_traffic(plan, profile, range(lo, hi), rows, topo, wire)
        # a stage sends its output forward and its input's gradient back, this rank's block of each
        out = samples * profile.layers[hi - 1].out_per_sample * share[hi - 1] if k + 1 < len(bounds) else 0.0
        inp = samples * profile.layers[lo - 1].out_per_sample * share[lo - 1] if k > 0 else 0.0
        stage_compute.append(c)
        stage_work.append(c + s_tp)
        stage_forward.append(sum(forward[lo:hi]) + runtime / 2)  # the runtime's cost a micro-batch: half each way
        # (its activation forward, its input's gradient back: seconds each, latency of the pair)
        stage_send.append((out * wire / pp_rate, inp * wire / pp_rate, topo.latency if out or inp else 0.0))
        hops.append(2 * out * wire / pp_rate)  # one activation forward and its gradient back
        tp_elems.append({ch: e * m for ch, e in e_tp.items()})
        tp_step.append(_tp_step(plan, profile, range(lo, hi), topo))  # once per step, after the micro-batches
        pp_elems.append((out + inp) * m)  # a middle stage sends both
    compute = max(stage_compute) * m
    picks, table_bytes, table_s, served = _tables(plan, profile, topo, compute, wire, settings)
    dense = [_stage_params(profile, plan, lo, hi, served) for lo, hi in bounds]
    dp_size, dp_stride = strides["dp"]
    reduced = plan.reduce_dtype.itemsize if plan.reduce_dtype else profile.elem  # gradients' width (bf16: asked)
    gathers = [0.0] * len(bounds)  # FSDP's gathers of one micro-batch, per stage
    units = fsdp_units(plan, bounds)
    if plan.dp_shard > 1:
        sharded = [_sharded_sync(plan, p, n, settings.compute_dtype.itemsize if settings.precision.compute
                                 else profile.elem, reduced, topo, dp_stride) for p, n in zip(dense, units)]
        dp_channels = {ch: max(c.get(ch, 0.0) for c, _, _ in sharded) for ch in sharded[0][0]}  # the busiest rank
        gathers = [g for _, g, _ in sharded]
        dp_s = max(t for _, _, t in sharded)
    else:
        dp_bytes = [_ring(dp_size, p) * reduced for p in dense]
        dp_channels = {"dp.dense": max(dp_bytes)}
        # DDP (pp 1) all-reduces bucket by bucket, each paying the ring's latency; a stage's tail, one flat buffer
        calls = _ddp_buckets(profile, plan, served) if plan.pp == 1 else 1
        dp_s = (max(dp_bytes) / topo.group_rate(dp_size, dp_stride)
                + (dp_size > 1) * calls * 2 * (dp_size - 1) * topo.latency)
        if plan.pp == 1 and dp_size > 1:  # DDP: buckets go out during backward; the last one cannot hide
            backward = 2 / 3 * compute
            dp_s -= topo.overlap * min(dp_s * (1 - 1 / calls), backward)
    comm_pipe, bubble = pipeline(plan, stage_compute, stage_forward, [w + g for w, g in zip(stage_work, gathers)],
                                 stage_send, hops)
    opt_s = max(dense) * profile.optimizer_per_elem * profile.step_factor / topo.speed
    # every step ends with small world collectives (the gradient norm over the axes, the loss for the log)
    tail_s = 2 * 2 * (topo.ranks - 1) * topo.latency
    nbytes = {**dp_channels, "pp": max(pp_elems) * wire}
    for ch in sorted({ch for e in tp_elems for ch in e}):
        nbytes[ch] = max(e.get(ch, 0.0) for e in tp_elems) * _width(ch, profile, wire)
    nbytes["tp.grads"] = max(b for b, _ in tp_step)
    if table_bytes:
        nbytes["sparse"] = table_bytes
    stage_mem = _stage_memory(plan, settings, profile, bounds, samples, wire, served, _rows_of(profile, plan))
    mem = max(stage_mem)
    held = max(m + topo.unit_memory * n for m, n in zip(stage_mem, units)) - mem  # (the fullest stage's, with it)
    tp_grads_s = max(s for _, s in tp_step)
    return Estimate(plan, compute + opt_s, comm_pipe + dp_s + table_s + tail_s + tp_grads_s, bubble,
                    {k: v for k, v in nbytes.items() if v}, mem, picks, held)


def fsdp_units(plan: ParallelPlan, bounds) -> list[int]:
    """FSDP units a rank of each stage runs (``bounds``: the stages' chain layers): each chain layer's modules,
    then the stage's root; none where the plan does not shard."""
    return [hi - lo + 1 if plan.dp_shard > 1 else 0 for lo, hi in bounds]


def _layer_seconds(plan: ParallelPlan, profile: Profile, samples: float) -> list[float]:
    """Per chain layer, one rank's forward and backward seconds on a micro-batch of ``samples``: under one of
    tessel's tensor-parallel grids as its layers were timed on stand-in groups, else (torch's peer, a profile not
    timed that way) the plain layer's over tp."""
    dry = profile.tp_seconds(plan.tp_mode.name, tuple(plan.tp_grid), plan.regather) if plan.tp > 1 else None
    if dry is None:
        return [layer.seconds(samples) / plan.tp for layer in profile.layers]
    return [layer.seconds(samples) for layer in dry]


def _sharded_sync(plan: ParallelPlan, params: float, units: int, gathered: int, elem: int, topo: Topology,
                  stride: int) -> tuple[dict[str, float], float, float]:
    """(bytes per channel, seconds of one micro-batch's gathers, seconds once a step) of FSDP's traffic on a stage
    of ``params`` dense elements in ``units`` units: every weight gathered from the s ranks of its shard group
    before each micro-batch's forward and again before its backward (in the compute width), its gradients
    reduce-scattered once a step (the masters' width), and under HSDP each gradient shard summed over its r
    replicas (a ring). gloo runs FSDP's calls one at a time, so nothing overlaps the compute: a micro-batch's
    gathers lengthen its slot on the stage (and so, in a pipeline, every stage downstream waits for them)."""
    s, r, m = plan.dp_shard, plan.dp_replicate, plan.micro_batches
    shard = params / s
    out = {"dp.gather": 2 * m * (s - 1) * shard * gathered, "dp.scatter": (s - 1) * shard * elem}
    rate = topo.group_rate(s, stride)
    gather = out["dp.gather"] / m / rate + 2 * units * (s - 1) * topo.latency
    seconds = out["dp.scatter"] / rate + units * (s - 1) * topo.latency
    if r > 1:
        out["dp.replicate"] = 2 * (r - 1) / r * shard * elem
        seconds += out["dp.replicate"] / topo.group_rate(r, stride * s) + units * 2 * (r - 1) * topo.latency
    return out, gather, seconds


def _layer_params(profile: Profile, plan: ParallelPlan) -> list[int]:
    """Parameter elements per layer on one rank (a tensor-parallel shard's, replicated pieces whole)."""
    if plan.tp == 1:
        return [layer.params for layer in profile.layers]
    return profile.shard_params(plan.tp_mode, plan.tp_grid)


def _stage_params(profile: Profile, plan: ParallelPlan, lo: int, hi: int, served: set[str]) -> float:
    """Elements the stage's dense sync all-reduces: its layers' parameters less the tables served by rows."""
    out = 0.0
    for layer, n in zip(profile.layers[lo:hi], _layer_params(profile, plan)[lo:hi]):
        out += n - sum(t.rows * t.dim / _table_parts(profile, plan, t.name) for t in profile.tables
                       if t.name in served and t.name in layer.tables)
    return out


def _ddp_buckets(profile: Profile, plan: ParallelPlan, served: set[str]) -> int:
    """All-reduces DDP makes of a whole model's gradients on one rank: its parameters (less the tables served by
    rows) in reverse, cut at the bucket size the run asks for (tessel's rule, or torch's 25 MB where DDP runs as
    shipped: no tessel hook, or torch's sparse gradients, whose own buckets are not counted)."""
    layers = profile.param_sizes(plan.tp_mode, plan.tp_grid)
    sizes = [n * profile.elem for layer, sizes in zip(profile.layers, layers)
             for name, n in sizes if not any(name.startswith(f"{t}.") for t in served if t in layer.tables)]
    as_shipped = not plan.ddp_hook or any(s.ddp_sparse for s in plan.sparse.given())
    cap = plan.bucket_mb or (buckets.TORCH_MB if as_shipped else buckets.auto_mb(sum(sizes)))
    return max(1, buckets.count(reversed(sizes), cap))


def _table_parts(profile: Profile, plan: ParallelPlan, name: str) -> int:
    """Blocks a table's rows are cut into on this plan (1-D tp: the token table by tp; a sampled head stays whole)."""
    if plan.tp == 1:
        return 1
    return profile.tp_layers(plan.tp_mode, plan.tp_grid).table_parts.get(name, plan.tp)


def stage_memory(plan: ParallelPlan, settings: Settings, profile: Profile, use: TableUse | None = None
                 ) -> list[float]:
    """Per pipeline stage, the bytes one of its ranks holds at its peak under ``plan`` (its bounds, or one
    stage): what a run prints beside the peak it measures. ``use``: what the run's tables measured and do (the
    rows a rank looks up per step, which tables fetch ahead); by default what the profile measured and the
    tables' own rule."""
    bounds = plan.bounds if plan.pp > 1 else ((0, len(profile.layers)),)
    samples = settings.global_batch / (plan.dp * plan.micro_batches)
    served = {t.name for t in plan.tables if t.strategy.served}
    rows = _rows_of(profile, plan, use)
    return _stage_memory(plan, settings, profile, bounds, samples, settings.wire_dtype.itemsize, served, rows)


def _rows_of(profile: Profile, plan: ParallelPlan, use: TableUse | None = None) -> dict[str, tuple[float, bool]]:
    """Table -> (unique rows one rank looks up in a step of the rows it serves, whether it also fetches the next
    step's during this one): the run's (``use``) where given, else the profile's measurement at the plan's dp (a 1-D
    vocabulary shard's part) and the table's rule: a scheduled all-to-all table on a column split, whole (a
    shard's ids are not the batch's), fed from the batch, under a synchronous schedule."""
    if use is not None:
        return {name: (n, name in use.ahead) for name, n in use.rows.items()}
    out = {}
    for t in profile.tables:
        if plan.dp in t.unique:
            parts = _table_parts(profile, plan, t.name)
            ahead = (t.fed and parts == 1 and plan.sparse.schedule and not plan.schedule.asynchronous
                     and any(c.name == t.name and c.strategy.name == "alltoall" and c.split == "column"
                             for c in plan.tables))
            out[t.name] = (t.unique[plan.dp] / parts, ahead)
    return out


def _rows_held(profile: Profile, layer, served: set[str], looked_up: dict[str, tuple[float, bool]]
               ) -> tuple[float, float]:
    """(Elements held through a step, elements of gradient from the layer's backward on) for the served tables
    of ``layer``: the rows a rank looked up (a leaf per lookup, at least the step's unique rows) and, for a table
    that fetches ahead, the next step's rows too; then the rows' gradients."""
    held = grad = 0.0
    for t in profile.tables:
        if t.name in layer.tables and t.name in served and t.name in looked_up:
            n, ahead = looked_up[t.name]
            held, grad = held + (1 + ahead) * n * t.dim, grad + n * t.dim
    return held, grad


def _activations(plan: ParallelPlan, profile: Profile, layers, shares: list[float], samples: float
                 ) -> tuple[list[float], list[float], list[float]]:
    """Per layer of ``layers`` ((index, LayerProfile)), the bytes one rank's forward saves, its backward holds
    beyond them and its forward holds beyond them, at ``samples`` a micro-batch: under tensor parallelism as its
    layers hold them (measured on stand-in groups: a 1-D layer's norms and residual stay whole, a 3-D one keeps
    its gathered blocks), else the plain layer's (or, where the layers' memory was not measured, cut as the output
    is cut)."""
    dry = profile.tp_memory(plan.tp_mode.name, tuple(plan.tp_grid), plan.regather) if plan.tp > 1 else None
    if dry is not None:
        rows = [dry[i].at(samples) for i, _ in layers]
        return tuple([max(row[c], 0.0) for row in rows] for c in range(3))
    inner = [1.0 if plan.tp == 1 else shares[i] for i, _ in layers]
    return tuple([getattr(layer, f) * samples * inner[j] for j, (_, layer) in enumerate(layers)]
                 for f in ("saved_per_sample", "work_per_sample", "ahead_per_sample"))


def _stage_memory(plan: ParallelPlan, settings: Settings, profile: Profile, bounds, samples: float,
                  wire: int, served: set[str], looked_up: dict[str, tuple[float, bool]]) -> list[float]:
    """Weights, optimizer state and the asynchronous schedules' weight copies, plus the most of the rest at once:
    the gradients (all of them in the optimizer's step), or, while a layer runs backward, the gradients made so
    far, the activations autograd keeps (every other micro-batch in flight whole, this one's up to the layer;
    under recompute only each layer's input, and the layer's whole set while it is recomputed) and the
    transients its backward holds (all measured per layer). Sharded (FSDP), a rank keeps 1/dp_shard of the
    weights and their state, one unit gathered whole at a time, and the gradients whole where micro-batches or
    stages defer the reduce-scatter to the step's last backward. Under tensor parallelism a layer's activations
    are cut as below. A table served by rows (``served``) is held as 1/dp of its rows and their row state,
    outside FSDP (which gathers only the dense weights), with the rows a step looks up (``looked_up``)."""
    states = settings.state_tensors
    recompute = plan.recompute.layers
    shares, per_layer, out = _out_share(profile, plan), _layer_params(profile, plan), []
    # activations measured under the run's autocast are taken as measured; measured in the parameters' dtype they
    # are scaled to the compute width
    scale = 1.0 if profile.autocast else wire / profile.elem
    # an FSDP unit is gathered in the compute dtype (parallelize.shard_model), counted in parameter elements
    low = settings.compute_dtype.itemsize / profile.elem if profile.autocast else 1.0
    m = plan.micro_batches
    for k, (lo, hi) in enumerate(bounds):
        # each layer's dense weights (a served table's rows get no dense gradient; they are held apart)
        grads = whole = [_stage_params(profile, plan, i, i + 1, served) for i in range(lo, hi)]
        params = sum(grads)
        tables = sum(per_layer[lo:hi]) - params
        copies = 0
        if plan.pp > 1 and plan.schedule.weights == "stash":
            copies = plan.pp - k  # one version per micro-batch in flight
        elif plan.pp > 1 and plan.schedule.weights == "predict":
            copies = plan.predict.kept_copies
        base = params * (1 + states + copies)
        if plan.dp_shard > 1:  # (the asynchronous schedules do not shard)
            base = params * (1 + states) / plan.dp_shard  # (+ the unit gathered whole for a layer's backward)
            if not (m > 1 or plan.pp > 1):  # reduce-scattered as each unit's backward ends
                grads = [g / plan.dp_shard for g in grads]
        rows, row_grads = zip(*(_rows_held(profile, layer, served, looked_up)
                                for layer in profile.layers[lo:hi]))
        # + a row shard of each served table, and the rows the step looked up
        base = (base + tables / plan.dp * (1 + states) + sum(rows)) * profile.elem
        layers = list(enumerate(profile.layers[lo:hi], start=lo))
        saved, works, aheads = _activations(plan, profile, layers, shares, samples * scale)
        if plan.dp_shard > 1 and low < 1:  # FSDP2 gathers the weights in bf16 and frees
            # them after the layer's forward: the bf16 copies autocast made of the plain layer's weights, which
            # its profile counted as saved, are that unit, held only while it runs (counted as ``gathered``)
            saved = [max(a - w * low * profile.elem, 0.0) for a, w in zip(saved, whole)]
        inputs = [profile.layers[i - 1].out_per_sample * shares[i - 1] * wire * samples if i > 0 else 0.0
                  for i, _ in layers]
        kept = inputs if recompute else saved  # what one micro-batch keeps until its backward
        if plan.recompute.keeps_matmuls:  # and a selective recompute its matrix products' outputs (measured on the
            # plain layer; under tensor parallelism cut as the layer's whole saved set is)
            plain = [layer.saved_per_sample * samples * scale for _, layer in layers]
            kept = [k + layer.selective_per_sample * samples * scale * (s / p if p else 1.0)
                    for k, (_, layer), s, p in zip(inputs, layers, saved, plain)]
        in_flight = m if plan.schedule.holds_all_micro else min(m, plan.pp - k)
        # the end of backward: every gradient, and replicated the copy the data-parallel sum works on (DDP's
        # hook, a bucket at a time; a stage's step tail, all of them flattened)
        copy = 0.0 if plan.dp == 1 or plan.dp_shard > 1 else params if plan.pp > 1 else min(
            params, plan.bucket_mb * 2**20 / profile.elem)
        peak = (sum(grads) + copy + sum(row_grads)) * profile.elem
        ddp = plan.pp == 1 and plan.dp > 1 and plan.dp_shard == 1
        s = plan.dp_shard
        # a forward meets the gradients where it runs after a backward (a later micro-batch's, 1F1B's or
        # accumulation's), and DDP's buckets (the gradients' storage) always
        grads_ahead = sum(grads) + sum(row_grads) if m > in_flight else sum(grads) if ddp else 0.0
        for j in range(len(layers)):  # layer j's backward: what is alive at once
            now = sum(kept[:j]) + saved[j]  # this micro-batch's activations up to it (recomputed: its own whole)
            work = works[j]
            made = sum(row_grads[j:]) + (sum(grads) if ddp else sum(grads[j:]))  # (DDP's: views of its buckets)
            gathered = whole[j] * low if s > 1 else 0.0  # FSDP: this layer's dense weights whole, as gathered
            first = (made + gathered) * profile.elem + (in_flight - 1) * sum(kept) + now + work
            # its forward, the last in flight's: what the forward makes and drops (a fused loss's logits)
            forward = (grads_ahead + gathered) * profile.elem + (in_flight - 1) * sum(kept) + now + aheads[j]
            if s > 1 and grads is not whole:  # and as its backward ends: its gradients whole, their
                # copy the reduce-scatter sends and one layer's weights whole (this one's, or the next one's that
                # FSDP2 gathers ahead), while the earlier layers' activations wait (the peak measured under FSDP)
                scatter = (sum(grads[j + 1:]) + 3 * whole[j] + sum(row_grads[j:])) * profile.elem
                first = max(first, scatter + (in_flight - 1) * sum(kept) + sum(kept[:j]))
            elif s > 1:  # deferred to the last micro-batch, as its backward ends: the earlier layers' gradients
                # still whole, the later ones' shards, this one's copy the reduce-scatter sends, the copy
                # tessel.comm receives into, its shard, and the next layer's weights FSDP2 gathers ahead (the
                # first layer, fed ids, is reduce-scattered last, by FSDP's final callback: nothing ahead)
                scatter = (sum(grads[:j + 1]) + sum(grads[j + 1:]) / s + (2 + 1 / s) * whole[j]
                           + (whole[j - 1] if j else 0.0) + sum(row_grads)) * profile.elem
                first = max(first, scatter + sum(kept[:j]))
            later = (sum(grads) + sum(row_grads) + gathered) * profile.elem + max(
                in_flight - (1 if m > in_flight else 2), 0) * sum(kept) + now  # a later micro-batch's
            peak = max(peak, forward, first, later + work if m > 1 else 0.0)
        out.append(base + peak)
    return out
