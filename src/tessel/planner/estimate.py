"""Predicted step time, bytes per channel and memory per rank of one candidate plan.

One vocabulary of estimate for every axis: a step is compute + exposed communication + bubble (seconds),
plus bytes one rank sends per step on each channel and the bytes a rank holds. The byte formulas are
those of :mod:`tessel.comm` (an all-reduce over P ranks sends 2(P-1)/P of the tensor, a point-to-point
send its size):

    dp.dense  2(dp-1)/dp · (parameters of the stage's tp shard, tables served by rows excluded) · elem (2: bf16, asked)
    pp        micro-batches · (boundary activations out + gradients back, this rank's tp block) · elem
    pp.tied   per weight two stages hold (a token table tied to the head): its gradient summed over them, once a step
    tp        micro-batches · Σ linears of the stage (tessel.tensor.cost.linear_traffic) · elem
    tp.head   the head's linear (1-D/2-D/3-D), per micro-batch (last stage)
    tp.loss   the vocabulary-parallel loss's per-row max, sum and target logit (fp32), per micro-batch (last stage)
    tp.embed  the token table's gathers, reduce-scatters or all-reduce, per micro-batch (first stage)
    tp.norm   LayerNorms over features cut by the grid, per micro-batch
    tp.grads  once per step: row-replicated pieces' gradients summed, and the fp64 squared norm

Time per micro-batch on stage k is its layers' compute (a tensor-parallel rank's block as timed on stand-in groups;
torch's peer's as the plain layer's over tp), over the rank's compute speed, plus what the runtime adds per
micro-batch where a calibration trial measured it (:mod:`.calibrate`), plus its tp collectives, or its boundary
sends at the rate of the pp group (:class:`Topology`) where those take longer: sends are asynchronous and travel
while the stage computes. A flushed schedule takes one slot of every stage (the first micro-batch's way through, its
work alone) and m - 1 slowest-stage slots, plus one activation's and gradient's trip over every
boundary (GPipe: each of its two phases so, a forward slot and a backward one, since it runs every forward before
any backward); an asynchronous one m slowest slots (no flush: the bubble is only the imbalance); DDP all-reduces the
gradients bucket by bucket, each a call of the ring's steps, and hides them behind backward up to the last bucket,
as far as the topology's measured overlap lets it; a pipeline's gradient sync, the tp gradient sums and the
optimizer step follow the micro-batches. A collective takes the longer of its bytes at its group's rate and its ring
steps at the topology's latency (Topology.call_seconds; a loss's or a norm's one element at the tiny latency), plus,
where the probe measured it, what it waits after the compute since its group last synchronized (Topology.wait: a tp
layer's compute split between its calls, a step's before the data-parallel sync; not FSDP's calls); FSDP's gathers
and reduce-scatters move at the rates the probe measured in the shard group's size (Topology.fsdp_rate). Under a CPU
quota a flushed pipeline's fill and drain run at a whole core for the host's quota (Topology.after_idle), and its
first crossings of a boundary carry only their bytes beyond a link's burst (Topology.link_burst). Tables served by
rows are priced by the sparse cost model (tessel.sparse.cost) with the surveyed unique rows and added as exposed
time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import buckets, choices
from ..pipeline.partition import balance
from ..plan import ParallelPlan
from ..settings import Settings
from ..sparse.cost import Link, Sparsity
from ..sparse.cost import estimate as table_estimate
from ..sparse.plan import AUTO_OPTIONS, follows
from ..tensor.cost import grad_sum_traffic, linear_traffic, norm_sum_traffic
from . import memory, weights
from .profile import LayerProfile, Profile
from .shards import first_use
from .span import pipeline
from .topology import Topology


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
    calls: dict[str, float] = field(default_factory=dict)  # channel -> collectives the busiest rank calls per step

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


# channels that carry fp32 whatever the compute dtype: norm and loss statistics (and gradient sums, priced on
# their own)
FULL_WIDTH = ("tp.norm", "tp.loss")


def _width(channel: str, profile: Profile, wire: int) -> int:
    """Bytes per element a tensor-parallel channel carries: activations and GEMM partial sums at the wire width
    (bf16 under mixed precision), norm and loss statistics at the parameters' (tessel.tensor.ops, on widths)."""
    return profile.elem if channel in FULL_WIDTH else wire


def _tp_traffic(plan: ParallelPlan, profile: Profile, layers: range, rows: float, topo: Topology, wire: int,
                cpu: list[float]) -> tuple[dict[str, float], dict[str, float], float]:
    """(channel -> elements this rank sends, channel -> calls, seconds) for one micro-batch of ``rows`` tokens
    through ``layers``:
    the linears (``tp``, the head's on ``tp.head``), the norms over split features, the token table, the loss
    (``tp.loss``). ``cpu``: per chain layer, a core's seconds of its compute on the micro-batch, which its calls
    split between them (each call waits after its share: Topology.wait)."""
    if plan.tp == 1:
        return {}, {}, 0.0
    shards = profile.tp_layers(plan.tp_mode, plan.tp_grid)
    live = plan.live_backward  # weights gathered again in backward
    again = plan.recompute.layers  # a recomputed layer's forward collectives run again in its backward
    elems: dict[str, float] = {}
    calls: dict[str, float] = {}
    seconds = 0.0
    for i in layers:
        # the first layer's input is data: no gradient of it is reduced
        moved = [(channel, *t) for h, h2, up, channel, ends in profile.layers[i].linears
                 for t in linear_traffic(plan.tp_mode, plan.tp_grid, rows, h, h2, up, plan.regather, i > 0, live,
                                         again, ends)]
        moved += [t for traffic in shards.traffic[i] for t in traffic(rows, again)]
        seconds += _tally(plan, profile, topo, moved, elems, calls, lambda ch: _width(ch, profile, wire), cpu[i])
    return elems, calls, seconds


def _tp_step(plan: ParallelPlan, profile: Profile, layers: range, topo: Topology) -> tuple[float, float, float]:
    """(bytes, calls, seconds) this rank sends once per step on ``tp.grads``: the row-replicated pieces'
    gradients summed over their axes, and the squared norm (one fp64 element) over the whole grid."""
    if plan.tp == 1:
        return 0.0, 0.0, 0.0
    shards = profile.tp_layers(plan.tp_mode, plan.tp_grid)
    partial: dict[tuple[str, ...], int] = {}
    for i in layers:
        for axes, n in shards.partial[i].items():
            partial[axes] = partial.get(axes, 0) + n
    elems: dict[str, float] = {}
    calls: dict[str, float] = {}
    seconds = _tally(plan, profile, topo, [("tp.grads", *t) for t in grad_sum_traffic(partial, shards.sizes)],
                     elems, calls, lambda ch: profile.elem)
    seconds += _tally(plan, profile, topo, [("tp.norm2", *t) for t in norm_sum_traffic(shards.sizes)], elems,
                      calls, lambda ch: 8)
    return (elems.get("tp.grads", 0.0) * profile.elem + elems.get("tp.norm2", 0.0) * 8, sum(calls.values()),
            seconds)


def _tally(plan: ParallelPlan, profile: Profile, topo: Topology, moved, elems: dict[str, float],
           calls: dict[str, float], width, cpu: float = 0.0) -> float:
    """Add ``moved`` [(channel, grid axis, elements, ring steps, calls)] to ``elems`` and ``calls``; returns their
    seconds on ``topo`` (``width``: channel -> bytes per element; ``cpu``: a core's seconds of compute the calls
    split between them, each waiting after its share)."""
    axes, (tp_size, tp_stride) = _tp_axes(plan), _strides(plan)["tp"]
    seconds = 0.0
    share = cpu / max(sum(n for *_, n in moved), 1.0)  # the compute before each call
    for channel, axis, e, steps, n in moved:
        size, stride = axes.get(axis, (tp_size, 1))
        seconds += topo.wait(size, n, share * n)  # (before the split below: an all-gather follows its pair at once)
        # an all-reduce (2(q - 1) steps a call; a gather or reduce-scatter has q - 1) of half-width terms is two
        # calls: tessel.comm's reduce-scatter and all-gather, the sum in fp32
        n *= 2 if width(channel) <= 2 and steps == 2 * (size - 1) * n else 1
        elems[channel] = elems.get(channel, 0.0) + e
        calls[channel] = calls.get(channel, 0.0) + n
        seconds += topo.call_seconds(e * width(channel), n, steps, topo.group_rate(size, stride * tp_stride),
                                     tiny=channel == "tp.norm2")  # (the squared norm: one fp64 element)
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
    # the sparse cost model's latency is a whole collective's, added to its bytes' time, as the run's own start-up
    # probe times it (tessel.sparse.cost.probe: a one-element all-reduce)
    link = Link(rate=topo.group_rate(size, stride), latency=topo.tiny_step * 2 * (size - 1), per_elem=2e-9,
                source="topology")
    allowed = AUTO_OPTIONS if policy.strategy.decides else (policy.strategy.builds,)
    hosts = max(1, min(plan.dp, topo.hosts))
    picks, nbytes, seconds, served, picked = {}, 0.0, 0.0, set(), {}
    for t in profile.tables:
        k = t.unique.get(plan.dp)
        if k is None or t.unique.get(1) is None:
            continue
        parts = weights.table_parts(profile, plan, t.name)  # a 1-D vocabulary shard holds 1/tp of the rows
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
    # (under recompute each layer's forward runs again in its backward: what that added on a micro-batch of this
    # size where the profile timed it, else the kind's assumed share)
    r = plan.recompute
    base = [t * profile.step_factor / topo.speed for t in _layer_seconds(plan, profile, samples)]
    again = [_again(layer, r, samples) if r.layers else 0.0 for layer in profile.layers]
    per_layer = [t * (1 + a) for t, a in zip(base, again)]
    # the forward's part (a recompute runs it again inside the backward, which holds that)
    forward = [t * layer.forward_share for t, layer in zip(base, profile.layers)]
    cpu = [t * topo.speed for t in per_layer]  # a core's seconds of each layer's compute (what its calls follow)
    bounds = plan.bounds or tuple(balance(per_layer, plan.pieces)) if plan.pp > 1 else ((0, len(per_layer)),)
    if plan.pp > 1 and not plan.bounds:
        plan = plan.with_(bounds=tuple(tuple(x) for x in bounds))
    strides = _strides(plan)
    pp_rate = topo.group_rate(*strides["pp"])
    burst = topo.link_burst if topo.spans_hosts(*strides["pp"]) else 0.0
    share = weights.out_share(profile, plan)
    stage_compute, stage_work, stage_send, tp_elems, pp_elems, tp_step, hops = [], [], [], [], [], [], []
    tp_calls, pp_calls = [], []  # per stage: channel -> calls a step; the boundary's sends and receives
    stage_forward = []  # per stage: the forward's part of its compute (``c`` below)
    runtime = _runtime(plan, profile, topo)
    for k, (lo, hi) in enumerate(bounds):
        c = sum(per_layer[lo:hi]) + runtime
        e_tp, n_tp, s_tp = _tp_traffic(plan, profile, range(lo, hi), rows, topo, wire, cpu)
        # a stage sends its output forward and its input's gradient back, this rank's block of each
        out = samples * profile.layers[hi - 1].out_per_sample * share[hi - 1] if k + 1 < len(bounds) else 0.0
        inp = samples * profile.layers[lo - 1].out_per_sample * share[lo - 1] if k > 0 else 0.0
        stage_compute.append(c)
        stage_work.append(c + s_tp)
        stage_forward.append(sum(forward[lo:hi]) + runtime / 2)  # the runtime's cost a micro-batch: half each way
        # (its activation forward, its input's gradient back: seconds each, latency of the pair)
        stage_send.append((out * wire / pp_rate, inp * wire / pp_rate, topo.latency if out or inp else 0.0))
        # one activation forward and its gradient back, each after its stage idled: a link's burst crosses at once
        hops.append(2 * max(0.0, out * wire - burst) / pp_rate)
        tp_elems.append({ch: e * m for ch, e in e_tp.items()})
        tp_calls.append({ch: n * m for ch, n in n_tp.items()})
        tp_step.append(_tp_step(plan, profile, range(lo, hi), topo))  # once per step, after the micro-batches
        pp_elems.append((out + inp) * m)  # a middle stage sends both
        pp_calls.append(2 * m * ((k + 1 < len(bounds)) + (k > 0)))  # each way: a send and its receive
    compute = max(stage_compute) * m
    picks, table_bytes, table_s, served = _tables(plan, profile, topo, compute, wire, settings)
    dense = [sum(weights.dense(profile, plan, lo, hi, served)) for lo, hi in bounds]
    dp_size, dp_stride = strides["dp"]
    reduced = plan.reduce_dtype.itemsize if plan.reduce_dtype else profile.elem  # gradients' width (bf16: asked)
    gathers = [0.0] * len(bounds)  # FSDP's gathers of one micro-batch, per stage
    units = memory.fsdp_units(plan, bounds)
    if plan.dp_shard > 1:
        passes = [profile.fsdp_calls(lo, hi) for lo, hi in bounds]  # FSDP's gathers a pass, per stage
        sharded = [_sharded_sync(plan, p, n, settings.compute_dtype.itemsize if settings.precision.compute
                                 else profile.elem, reduced, topo, dp_stride) for p, n in zip(dense, passes)]
        dp_channels = {ch: max(c.get(ch, 0.0) for c, _, _ in sharded) for ch in sharded[0][0]}  # the busiest rank
        gathers = [g for _, g, _ in sharded]
        dp_s = max(t for _, _, t in sharded)
        dp_calls = {"dp.gather": 2 * max(passes) * m, "dp.scatter": max(passes),
                    "dp.replicate": max(passes) * (2 if plan.reduce_dtype else 1)}
    else:
        dp_bytes = [_ring(dp_size, p) * reduced for p in dense]
        dp_channels = {"dp.dense": max(dp_bytes)}
        # DDP (pp 1) all-reduces bucket by bucket, each a call of the ring's steps; a stage's tail, one flat buffer
        calls = _ddp_buckets(profile, plan, served) if plan.pp == 1 else 1
        dp_s = topo.call_seconds(max(dp_bytes), calls, calls * 2 * (dp_size - 1), topo.group_rate(dp_size, dp_stride))
        # (a half-width sum is two calls, tessel.comm's reduce-scatter and all-gather, of the same ring steps)
        dp_calls = {"dp.dense": calls * (2 if plan.reduce_dtype else 1)}
        if plan.pp == 1 and dp_size > 1:  # DDP: buckets go out during backward; the last one cannot hide
            backward = 2 / 3 * compute
            dp_s -= topo.overlap * min(dp_s * (1 - 1 / calls), backward)
        # the data group last synchronized a step ago: its sync waits after the stage's micro-batches
        dp_s += topo.wait(dp_size, 1, compute * topo.speed)
    comm_pipe, bubble = pipeline(plan, stage_compute, stage_forward, [w + g for w, g in zip(stage_work, gathers)],
                                 stage_send, hops, topo.after_idle if topo.quota else None)
    # a weight two stages hold (a tied one): its copies' gradients summed once a step, one all-reduce each
    tied = weights.tied(profile, plan, bounds)
    tied_bytes = [sum(_ring(g, n) * profile.elem for n, g in t) for t in tied]
    tied_s = max(topo.call_seconds(b, len(t), sum(2 * (g - 1) for _, g in t), pp_rate)
                 for b, t in zip(tied_bytes, tied))
    opt_s = max(dense) * profile.optimizer_per_elem * profile.step_factor / topo.speed
    # every step ends with one-element sums, each over its own group: the squared gradient norm over the stages (and
    # over FSDP's shard group), the loss over the data axis for the log (the preemption check, over the world, is
    # asynchronous and waited a step later); the grid's norm is tp.grads'
    steps = 2 * (plan.pp - 1) + 2 * (plan.dp - 1) + 2 * (plan.dp_shard - 1)
    tail_s = topo.call_seconds(0.0, 1, steps, 1.0, tiny=True)  # (one fp64 element each)
    nbytes = {**dp_channels, "pp": max(pp_elems) * wire, "pp.tied": max(tied_bytes)}
    for ch in sorted({ch for e in tp_elems for ch in e}):
        nbytes[ch] = max(e.get(ch, 0.0) for e in tp_elems) * _width(ch, profile, wire)
    nbytes["tp.grads"] = max(b for b, _, _ in tp_step)
    ncalls = {ch: max(c.get(ch, 0.0) for c in tp_calls) for ch in {ch for c in tp_calls for ch in c}}
    ncalls |= {"tp.grads": max(n for _, n, _ in tp_step), "pp": max(pp_calls), "pp.tied": max(map(len, tied))}
    ncalls |= {ch: n for ch, n in dp_calls.items() if dp_channels.get(ch)}
    if table_bytes:
        nbytes["sparse"] = table_bytes
    stage_mem = memory.peaks(plan, settings, profile, bounds, samples, wire, served, memory.rows_of(profile, plan))
    mem = max(stage_mem)
    held = max(m + topo.unit_memory * n for m, n in zip(stage_mem, units)) - mem  # (the fullest stage's, with it)
    tp_grads_s = max(s for _, _, s in tp_step)
    return Estimate(plan, compute + opt_s, comm_pipe + dp_s + table_s + tail_s + tp_grads_s + tied_s, bubble,
                    {k: v for k, v in nbytes.items() if v}, mem, picks, held, {k: v for k, v in ncalls.items() if v})


def _runtime(plan: ParallelPlan, profile: Profile, topo: Topology) -> float:
    """Seconds the runtime adds to each micro-batch on a stage beyond its layers: what each micro-batch beyond the
    first adds to a one-process step (a calibration trial's, on the job's hosts; else the profile's, a core's
    seconds on this machine, at the host's speed), (m - 1)/m of it a micro-batch, in a pipeline too. The first's is
    in the step factor; charged for every micro-batch of a pipeline stage, fixed costs per model priced pipelines
    of one or two micro-batches up to 47% slow (docs/benchmarks.md, "The runtime's cost per micro-batch,
    profiled")."""
    m = plan.micro_batches
    each = profile.per_micro / topo.speed if topo.per_micro is None else topo.per_micro
    return each * (m - 1) / m


def _again(layer: LayerProfile, recompute: choices.Recompute, samples: float) -> float:
    """The share of ``layer``'s time that ``recompute`` adds on a micro-batch of ``samples``: as the profile timed
    it, else the kind's assumed share."""
    timed = layer.again_at(recompute.name, samples)
    return recompute.again if timed is None else timed


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
    of ``params`` dense elements gathered in ``units`` calls a pass: every weight gathered from the s ranks of its
    shard group before each micro-batch's forward and again before its backward (in the compute width), its gradients
    reduce-scattered once a step (the masters' width), and under HSDP each gradient shard summed over its r
    replicas (a ring). gloo runs FSDP's calls one at a time, so nothing overlaps the compute: a micro-batch's
    gathers lengthen its slot on the stage (and so, in a pipeline, every stage downstream waits for them). Each
    collective moves at the rate the probe measured it to in groups of that size, where it did (Topology.fsdp_rate).
    No wait after compute (Topology.wait) is charged: charged a third of a unit's compute before each call, it priced
    the saved cells' 25 FSDP candidates a median 13% slow, and without it 1% (docs/benchmarks.md, "FSDP's calls
    without a wait after compute")."""
    s, r, m = plan.dp_shard, plan.dp_replicate, plan.micro_batches
    shard = params / s
    out = {"dp.gather": 2 * m * (s - 1) * shard * gathered, "dp.scatter": (s - 1) * shard * elem}
    gather = topo.call_seconds(out["dp.gather"] / m, 2 * units, 2 * units * (s - 1), topo.fsdp_rate(
        s, stride, "gather"))
    seconds = topo.call_seconds(out["dp.scatter"], units, units * (s - 1), topo.fsdp_rate(s, stride, "scatter"))
    if r > 1:
        out["dp.replicate"] = 2 * (r - 1) / r * shard * elem
        seconds += topo.call_seconds(out["dp.replicate"], units, units * 2 * (r - 1), topo.group_rate(r, stride * s))
    return out, gather, seconds


def _ddp_buckets(profile: Profile, plan: ParallelPlan, served: set[str]) -> int:
    """All-reduces DDP makes of a whole model's gradients on one rank: its parameters (less the tables served by
    rows) in reverse, cut at the bucket size the run asks for (tessel's rule, or torch's 25 MB where DDP runs as
    shipped: no tessel hook, or torch's sparse gradients, whose own buckets are not counted)."""
    sizes = [n * profile.elem for layer, named in zip(profile.layers, first_use(profile.param_sizes(
                 plan.tp_mode, plan.tp_grid))) for name, n in named
             if not any(name.startswith(f"{t}.") for t in served if t in layer.tables)]
    as_shipped = not plan.ddp_hook or any(s.ddp_sparse for s in plan.sparse.given())
    cap = plan.bucket_mb or (buckets.TORCH_MB if as_shipped else buckets.auto_mb(sum(sizes)))
    return max(1, buckets.count(reversed(sizes), cap))
