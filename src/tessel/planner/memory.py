"""Bytes one rank holds at its peak under a plan, stage by stage: weights, optimizer state, gradients, the
activations its schedule keeps and the transients a layer's backward holds, FSDP's gathered units and the rows of
the tables served by rows. What :func:`.estimate.estimate` checks a plan against, and what a run prints beside the
peak it measures (:func:`stage_memory`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plan import ParallelPlan
from ..settings import Settings
from . import weights
from .profile import Profile

if TYPE_CHECKING:
    from ..sparse.served import TableUse


def fsdp_units(plan: ParallelPlan, bounds) -> list[int]:
    """FSDP units a rank of each stage runs (``bounds``: the stages' chain layers): each chain layer's modules,
    then the stage's root; none where the plan does not shard."""
    return [hi - lo + 1 if plan.dp_shard > 1 else 0 for lo, hi in bounds]


def stage_memory(plan: ParallelPlan, settings: Settings, profile: Profile, use: TableUse | None = None
                 ) -> list[float]:
    """Per pipeline stage, the bytes one of its ranks holds at its peak under ``plan`` (its bounds, or one
    stage): what a run prints beside the peak it measures. ``use``: what the run's tables measured and do (the
    rows a rank looks up per step, which tables fetch ahead); by default what the profile measured and the
    tables' own rule."""
    bounds = plan.bounds if plan.pp > 1 else ((0, len(profile.layers)),)
    samples = settings.global_batch / (plan.dp * plan.micro_batches)
    served = {t.name for t in plan.tables if t.strategy.served}
    rows = rows_of(profile, plan, use)
    return peaks(plan, settings, profile, bounds, samples, settings.wire_dtype.itemsize, served, rows)


def rows_of(profile: Profile, plan: ParallelPlan, use: TableUse | None = None) -> dict[str, tuple[float, bool]]:
    """Table -> (unique rows one rank looks up in a step of the rows it serves, whether it also fetches the next
    step's during this one): the run's (``use``) where given, else the profile's measurement at the plan's dp (a 1-D
    vocabulary shard's part) and the table's rule: a scheduled all-to-all table on a column split, whole (a
    shard's ids are not the batch's), fed from the batch, under a synchronous schedule."""
    if use is not None:
        return {name: (n, name in use.ahead) for name, n in use.rows.items()}
    out = {}
    for t in profile.tables:
        if plan.dp in t.unique:
            parts = weights.table_parts(profile, plan, t.name)
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


def peaks(plan: ParallelPlan, settings: Settings, profile: Profile, bounds, samples: float,
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
    shares, out = weights.out_share(profile, plan), []
    # activations measured under the run's autocast are taken as measured; measured in the parameters' dtype they
    # are scaled to the compute width
    scale = 1.0 if profile.autocast else wire / profile.elem
    # an FSDP unit is gathered in the compute dtype (parallelize.shard_model), counted in parameter elements
    low = settings.compute_dtype.itemsize / profile.elem if profile.autocast else 1.0
    m = plan.micro_batches
    for k, (lo, hi) in enumerate(bounds):
        # each layer's dense weights (a served table's rows get no dense gradient; they are held apart)
        grads = whole = weights.dense(profile, plan, lo, hi, served)
        params = sum(grads)
        tables = sum(weights.served(profile, plan, layer, served) for layer in profile.layers[lo:hi])
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
