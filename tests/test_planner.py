"""The planner: candidates, feasibility, the bytes it predicts against the bytes a real step sends, and the
``tessel plan`` / ``--plan`` interfaces.

The byte test runs each candidate's first step on a 4-rank gloo world through the trainer's composer and
compares what tessel.comm counted, per channel on the busiest rank, with the planner's prediction: dp.dense (or
FSDP's dp.gather, dp.scatter and dp.replicate), pp, tp and every tp.* channel (the head and loss, the token
table, the norms, the gradient sums) exactly.
"""

import json
import math
from collections import Counter
from dataclasses import replace

import pytest
import torch

from tessel import comm, planner
from tessel.cli import main
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.plan import ParallelPlan, TablePolicy, problems
from tessel.planner.candidates import enumerate_plans
from tessel.planner.estimate import estimate
from tessel.planner.profile import measure
from tessel.resolve import job_of, policy_of, saved_plan_for, settings_of
from tessel.train.build import build, build_data

TINY = {
    "transformer_lm": ["model.name=transformer_lm", "model.dim=16", "model.layers=2", "model.heads=4",
                       "data.vocab_size=64", "data.seq_len=8", "train.global_batch=8", "sparse.strategy=dense",
                       "train.dtype=float64"],
    "classifier": ["model.name=classifier", "model.in_features=24", "model.hidden=32", "model.layers=3",
                   "model.classes=8", "train.global_batch=8", "train.dtype=float64"],
}
EXACT = ("dp.dense", "dp.gather", "dp.scatter", "dp.replicate", "pp", "tp")  # and every tp.* channel


def _channels(predicted: dict, measured: list[dict]) -> set[str]:
    tp = {c for c in predicted if c.startswith(("tp.", "pp."))} | {c for r in measured for c in r
                                                                  if c.startswith(("tp.", "pp."))}
    return set(EXACT) | tp


TOPO = planner.Topology(ranks=4, hosts=4, link_mbit=1000)


def _step_bytes(base, plan_json):
    cfg, plan = load_config(None, base), ParallelPlan.from_json(plan_json)
    settings = settings_of(cfg)
    plan.check(settings)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(0)
    model = build(cfg, getattr(data, "vocab_size", 0)).to(settings.torch_dtype)
    x, y = ShardedLoader(data, cfg.train.global_batch, mesh.get_local_rank("dp"), plan.dp).next_batch()
    x = x.to(settings.torch_dtype) if x.is_floating_point() else x
    par = parallelize(model, plan, mesh, [(x, y)], settings)
    comm.counter.end_step()
    par.engine.step(x, y, 0)
    calls = comm.counter.calls()
    return {c: v["sent"] for c, v in comm.counter.end_step().items()}, calls


def _same_counts(est, got, plan) -> None:
    """A step's bytes sent and collectives called, the busiest rank's per channel, are the estimate's: the bytes
    on every channel it prices (and any tp.* one the step used), the calls on the tensor-, data- and
    pipeline-parallel channels."""
    sent, calls = [b for b, _ in got], [c for _, c in got]
    for channel in _channels(est.bytes, sent):
        assert est.bytes.get(channel, 0) == max(r.get(channel, 0) for r in sent), (plan.describe(), channel,
                                                                                   est.bytes, sent)
    for channel in set(est.calls) | {c for r in calls for c in r if c.startswith(("tp", "dp", "pp"))}:
        assert est.calls.get(channel, 0) == max(r.get(channel, 0) for r in calls), (plan.describe(), channel,
                                                                                    est.calls, calls)


PLANS = {  # model -> synchronous candidates of every shape on 4 ranks
    "transformer_lm": [ParallelPlan(dp=4), ParallelPlan(dp=2, tp=2, tp_grid=(2,)),
                       ParallelPlan(dp=1, tp=4, tp_mode="3d", tp_grid=(2, 2, 1)),
                       ParallelPlan(dp=2, pp=2, micro_batches=2),
                       ParallelPlan(dp=1, pp=2, tp=2, tp_grid=(2,), schedule="gpipe", micro_batches=2),
                       ParallelPlan(dp=1, pp=2, tp=2, tp_mode="2d", tp_grid=(2, 1), micro_batches=1),
                       # sharded: FSDP over 4 and HSDP 2 x 2 (every dim 0 divides, so no padding); FSDP on 2
                       # stages: test_fsdp_on_a_pipeline_gathers_each_unit_twice_a_micro_batch
                       ParallelPlan(dp=4, dp_shard=4), ParallelPlan(dp=4, dp_shard=2, micro_batches=2),
                       ParallelPlan(dp=4, dp_shard=2, grad_reduce="bf16"),  # bf16 reduce-scatter and replicate
                       # recomputed: each layer's forward collectives run again in its backward, but not the sum
                       # of the linear that ends a block or the head (torch's recompute stops at the last saved
                       # tensor, and the residual add after it saves none)
                       ParallelPlan(dp=2, tp=2, tp_grid=(2,), recompute="layers"),
                       ParallelPlan(dp=1, tp=4, tp_mode="3d", tp_grid=(2, 2, 1), recompute="layers"),
                       ParallelPlan(dp=1, tp=4, tp_mode="2d", tp_grid=(2, 2), recompute="selective")],
    "classifier": [ParallelPlan(dp=4), ParallelPlan(dp=1, tp=4, tp_mode="2d", tp_grid=(2, 2)),
                   ParallelPlan(dp=2, pp=2, micro_batches=4), ParallelPlan(dp=1, pp=2, tp=2, tp_grid=(2,)),
                   # gradients all-reduced in bf16 (asked for): DDP's hook, and a pipeline's step tail
                   ParallelPlan(dp=4, grad_reduce="bf16"),
                   ParallelPlan(dp=2, pp=2, micro_batches=2, grad_reduce="bf16"),
                   ParallelPlan(dp=1, tp=4, tp_mode="3d", tp_grid=(2, 2, 1), recompute="layers"),
                   ParallelPlan(dp=1, tp=4, tp_grid=(4,), recompute="layers")],
}


@pytest.mark.parametrize("model", sorted(PLANS))
def test_predicted_bytes_equal_measured(world4, model):
    base = TINY[model]
    cfg = load_config(None, base)
    profile = measure(job_of(cfg), dps=(1, 2, 4))
    for plan in PLANS[model]:
        # fills in the stage cut the run is given
        est = estimate(plan.with_(sparse=policy_of(cfg)), settings_of(cfg), profile, TOPO)
        _same_counts(est, world4.run(_step_bytes, base, est.plan.to_json()), plan)


def test_fsdp_on_a_pipeline_gathers_each_unit_twice_a_micro_batch(world4):
    """FSDP on 2 stages gathers each unit of a stage twice a micro-batch (forward, backward) and nothing more,
    under 1F1B and GPipe: every rank's gathers in m micro-batches are m times its gathers in one, call for call and
    byte for byte. (torch's own backward prefetch walks back along every micro-batch's forwards and gathered a
    stage's last unit once more a step, unused; tessel.fsdp lists each unit's prefetch in the chain's order.) The
    predicted bytes and calls equal a step's."""
    base = TINY["transformer_lm"]
    cfg = load_config(None, base)
    profile = measure(job_of(cfg), dps=(1, 2))
    try:
        runs = {}
        for plan in (ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=1),
                     ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=2),
                     ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=4, schedule="gpipe")):
            est = estimate(plan.with_(sparse=policy_of(cfg)), settings_of(cfg), profile, TOPO)
            runs[plan.micro_batches] = got = world4.run(_step_bytes, base, est.plan.to_json())
            _same_counts(est, got, plan)
        one = [(sent["dp.gather"], calls["dp.gather"]) for sent, calls in runs[1]]
        assert all(b > 0 and n >= 2 for b, n in one)
        for m in (2, 4):
            assert [(sent["dp.gather"], calls["dp.gather"]) for sent, calls in runs[m]] == [
                (m * b, m * n) for b, n in one], m
    finally:
        # a fresh world for the next test: after FSDP on a pipeline, a later task's sharded weights in these
        # processes named a process group this task's end destroyed (tessel.unwrap could not resolve it)
        world4.broken = True


def test_a_tied_weight_is_priced_once_where_one_rank_holds_it_once(world4):
    """The token table tied to the head is one weight on a stage that holds both (DDP all-reduces it once, FSDP
    gathers and scatters it once) and a copy on each stage that holds one of them: the predicted bytes equal a
    step's, channel by channel, and the optimizer's elements count it once."""
    base = [*TINY["transformer_lm"], "model.tie_embeddings=true"]
    cfg = load_config(None, base)
    profile = measure(job_of(cfg), dps=(1, 2, 4))
    untied = measure(job_of(load_config(None, TINY["transformer_lm"])), dps=(1,))
    assert profile.params == untied.params - 64 * 16  # (vocab x dim: the head's own weight gone)
    assert "tok_emb" not in {t.name for t in profile.tables}  # (dense at run time: never priced as served by rows)
    for plan in (ParallelPlan(dp=4), ParallelPlan(dp=4, dp_shard=4), ParallelPlan(dp=2, pp=2, micro_batches=2)):
        est = estimate(plan.with_(sparse=policy_of(cfg)), settings_of(cfg), profile, TOPO)
        _same_counts(est, world4.run(_step_bytes, base, est.plan.to_json()), plan)


BF16 = ["train.dtype=float32", "train.precision=bf16-mixed"]
PLANS_BF16 = [ParallelPlan(dp=2, pp=2, micro_batches=2), ParallelPlan(dp=2, tp=2, tp_grid=(2,)),
              ParallelPlan(dp=1, tp=4, tp_mode="3d", tp_grid=(2, 2, 1)), ParallelPlan(dp=4, dp_shard=4),
              ParallelPlan(dp=1, pp=2, tp=2, tp_mode="2d", tp_grid=(2, 1), micro_batches=1)]


def test_predicted_bytes_equal_measured_in_bf16_mixed(world4):
    """The planner prices each channel at the width it crosses in under bf16-mixed (activations, gathered weights
    and partial sums at 2 bytes; gradients reduced in fp32): its bytes equal a bf16-mixed step's, channel by
    channel, as in fp64 above."""
    base = [*TINY["transformer_lm"], *BF16]
    cfg = load_config(None, base)
    profile = measure(job_of(cfg), dps=(1, 2, 4))
    for plan in PLANS_BF16:
        est = estimate(plan.with_(sparse=policy_of(cfg)), settings_of(cfg), profile, TOPO)
        _same_counts(est, world4.run(_step_bytes, base, est.plan.to_json()), plan)


def test_no_plan_fits_names_each_way_of_cutting_the_world_refused():
    """The LSTM on 5 ranks: a batch of 32 over no dp of 5, 3 pipeline layers for 5 stages, no tensor-parallel form.
    The error names all three, once each, where it named only the first refusal (the pipeline's), as if a dp of 5
    had never been tried."""
    from tessel.errors import PlanError
    from tessel.meta import on_meta
    from tessel.planner.candidates import feasible
    from tessel.planner.choose import Planned

    job = job_of(load_config(None, ["model.name=lstm_lm", "model.dim=16", "model.hidden=32", "data.vocab_size=64",
                                    "train.global_batch=32"]))

    def meta():
        with on_meta():
            return job.build()
    ok, dropped = feasible(enumerate_plans(job.base, 5, 32), job.settings, meta)
    assert not ok
    with pytest.raises(PlanError) as e:
        _ = Planned([], dropped, planner.Topology(ranks=5), None, 0.0, []).best
    msg = str(e.value)
    assert msg.startswith("no plan fits 5 ranks for this model: ")
    assert "global batch 32 is not divisible by dp=5" in msg and "pp=5 stages" in msg and "(tp=5)" in msg
    assert msg.count("global batch") == 1


def test_candidates_and_feasibility():
    cfg = load_config(None, TINY["transformer_lm"])
    job = job_of(cfg)
    plans = enumerate_plans(job.base, 8, job.settings.global_batch)
    assert all(p.world == 8 for p in plans)
    assert not any(p.schedule.asynchronous for p in plans)  # only with allow_async
    offered = {(p.schedule.name, p.predict.name)
               for p in enumerate_plans(job.base, 8, job.settings.global_batch, allow_async=True) if p.pp > 1}
    assert offered == {("1f1b", "v1"), ("gpipe", "v1"), ("async", "v1"), ("async-stash", "v1"),
                       ("async-predict", "v1"), ("async-predict", "v2"), ("async-predict", "opt")}
    # every grid of 8 ranks with at least two real axes (one real axis is the 1-D layout)
    assert {(p.tp_mode.name, p.tp_grid) for p in plans if p.tp == 8} == {
        ("1d", (8,)), ("2d", (2, 4)), ("2d", (4, 2)), ("3d", (2, 2, 2)), ("3d", (1, 2, 4)), ("3d", (1, 4, 2)),
        ("3d", (2, 1, 4)), ("3d", (4, 1, 2)), ("3d", (2, 4, 1)), ("3d", (4, 2, 1))}
    assert {p.tp_grid for p in plans if p.tp == 4 and p.tp_mode.name == "3d"} == {(1, 2, 2), (2, 1, 2), (2, 2, 1)}
    done = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200))
    # 4 layers (embed, 2 blocks, head) cannot make 8 stages; every refusal carries its reason
    assert any(p.pp == 8 and "8 stages" in why for p, why in done.dropped)
    # fastest first; steps within a microsecond count as a tie, which the simpler plan wins
    assert done.ranked and all(a.step <= b.step + 1e-6 for a, b in zip(done.ranked, done.ranked[1:]))
    best = done.best.plan
    assert best.world == 8 and (best.pp == 1 or best.bounds)
    # the plan is all the composer reads: it round-trips through the file a run can be given
    assert ParallelPlan.from_json(best.to_json()) == best and best.sparse == policy_of(cfg)
    # plans priced alike rank by how little they change the math: SpecTrain's prediction before stale weights
    loose = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200), allow_async=True,
                           profile=done.profile)
    first = loose.ranked[0].plan
    twins = [e.plan for e in loose.ranked if e.plan.with_(schedule="1f1b", predict="v1") ==
             first.with_(schedule="1f1b", predict="v1") and math.isclose(e.step, loose.ranked[0].step)]
    order = [(p.schedule.name, p.predict.name) for p in twins if p.schedule.asynchronous]
    # (opt before v2: as stale, and it keeps no weight copy)
    assert order == [("async-predict", "v1"), ("async-predict", "opt"), ("async-predict", "v2"), ("async-stash", "v1"),
                     ("async", "v1")][:len(order)] and len(order) >= 2
    # under an optimizer no row optimizer mirrors (NAdamW) no table is priced as served, as the run serves none; a
    # plan naming a served strategy is refused with the reason
    topo, nadamw = planner.Topology(ranks=8, hosts=8, link_mbit=200), job.settings.with_(optimizer="nadamw")
    named = next(p for p in plans if p.dp == 8).with_(sparse=TablePolicy(strategy="ps"))
    assert estimate(named, job.settings, done.profile, topo).tables
    assert not estimate(named, nadamw, done.profile, topo).tables
    # a served table's calls each pay a whole collective at the one-element latency (the sparse cost model's, as its
    # start-up probe times it: a one-element all-reduce, 2(8-1) ring steps), ps 6 a step; the step's tail, the loss
    # summed over the 8 data-parallel ranks, one more
    a, b = (estimate(named, job.settings, done.profile, replace(topo, latency=1e-3, tiny_latency=t))
            for t in (1e-4, 2e-4))
    assert a.tables and math.isclose(b.comm - a.comm, (len(a.tables) * 6 * 2 * 7 + 2 * 7) * 1e-4, rel_tol=1e-9)
    assert not problems(named, job.settings) and "no row optimizer mirrors it" in problems(named, nadamw)[0]
    # a memory budget under the winner's need drops it
    tight = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200, memory=done.best.memory - 1),
                           profile=done.profile)
    assert all(e.memory <= done.best.memory - 1 for e in tight.ranked) and tight.over_memory
    # with a headroom the winner is dropped from a budget it would fill: held to the memory less 10%
    kept = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200, memory=done.best.memory,
                                                headroom=0.1), profile=done.profile)
    assert done.best in kept.over_memory and all(e.memory <= 0.9 * done.best.memory for e in kept.ranked)
    # under every replicated plan's need but tensor parallelism's (which cuts the weights too), what fits is sharded
    # (FSDP or HSDP) or tensor-parallel, and sharded plans are among it
    replicated = min(e.memory for e in done.ranked if e.plan.dp_shard == 1 and e.plan.tp == 1)
    lean = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200, memory=replicated - 1),
                          profile=done.profile)
    assert all(e.plan.dp_shard > 1 or e.plan.tp > 1 for e in lean.ranked), lean.table()
    assert any(e.plan.dp_shard > 1 for e in lean.ranked), lean.table()
    # on the CPU what FSDP's units hold beside their tensors counts too: each sharded candidate needs its fullest
    # stage's units (chain layers + its root) times the bytes a unit holds; unsharded ones nothing more
    unit = 2**20
    held = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200, memory=replicated - 1,
                                                unit_memory=unit), profile=done.profile)
    sharded = [e for e in held.ranked + held.over_memory if e.plan.dp_shard > 1]
    assert sharded and all(e.held == unit * max(hi - lo + 1 for lo, hi in e.plan.bounds or ((0, 4),))
                           and e.needs == e.memory + e.held for e in sharded)
    assert all(e.held == 0 for e in held.ranked + held.over_memory if e.plan.dp_shard == 1)
    # and a sharded plan whose tensors fit but whose units do not is over memory
    assert any(e.memory <= replicated - 1 < e.needs for e in held.over_memory), held.table()
    assert all(e.needs <= replicated - 1 for e in held.ranked)
    # every layout with dp > 1 also sharded over each divisor of dp (HSDP between 1 and dp), tensor-parallel ones
    # included
    variants = Counter(p.with_(dp_shard=1) for p in plans)
    assert all(variants[p.with_(dp_shard=1)] == sum(p.dp % s == 0 for s in range(1, p.dp + 1)) for p in plans)
    assert any(1 < p.dp_shard < p.dp for p in plans) and any(p.dp_shard == p.dp > 1 for p in plans)
    assert any(e.plan.dp_shard > 1 and e.plan.tp > 1 for e in done.ranked)
    # every layout also with each layer recomputed: more compute (a forward again: a third of a layer's), never
    # more memory than the layout keeping its activations, so never the pick where that one fits too
    assert sum(p.recompute.layers for p in plans) == len(plans) / 2 and not done.best.plan.recompute.layers
    keeping = {e.plan: e for e in done.ranked if not e.plan.recompute.layers}
    pairs = [(e, keeping[e.plan.with_(recompute="none")]) for e in done.ranked
             if e.plan.recompute.layers and e.plan.with_(recompute="none") in keeping]
    assert pairs and all(r.compute > k.compute and r.memory <= k.memory for r, k in pairs)
    # (in most: a stage whose peak is at the step's end holds no activations then)
    assert sum(r.memory < k.memory for r, k in pairs) > len(pairs) / 2
    # under the leanest layout that keeps its activations, what fits recomputes, and a run's plan says so
    leanest = min(k.memory for k in keeping.values())
    squeezed = planner.choose(job, planner.Topology(ranks=8, hosts=8, link_mbit=200, memory=leanest - 1),
                              profile=done.profile)
    assert squeezed.ranked and all(e.plan.recompute.layers for e in squeezed.ranked), squeezed.table()
    assert "recompute layers" in squeezed.best.plan.describe()
    assert ParallelPlan.from_json(squeezed.best.plan.to_json()).recompute.name == "layers"


def test_profile_times_the_sizes_in_turn_and_the_real_step_beside_the_global_batch(monkeypatch):
    """Every size once a round, in turn (the order reversed every other round), its memory counted and its
    warm-up run only in the first; a layer's time the median of the rounds'; the real step and an optimizer step
    right after the global batch's layers in every round. Fake timings, so the expected values are exact."""
    from tessel.pipeline.partition import LayerCost
    from tessel.planner import timing

    order, rounds = [], iter(range(100))
    took = {(0, 2): 4.0, (0, 8): 9.0, (1, 8): 7.0, (1, 2): 2.0, (2, 2): 3.0, (2, 8): 8.0}  # (round, size) -> s

    def fake_profile(model, chain, x, y, repeats, memory, pool, warm):
        r = sum(1 for n, *_ in order if n == x.shape[0])
        order.append((x.shape[0], memory, warm, repeats))
        return [LayerCost("a", took[(r, x.shape[0])], 10, (1,), "float32", 4, saved=7 if memory else 0,
                          forward=took[(r, x.shape[0])] / 4)]

    def fake_step(model, settings, x, y, micro=1):
        label = ("step",) if micro == 1 else ("step", micro)
        return lambda: (order.append(label), 20.0 + next(rounds))[1]

    monkeypatch.setattr(timing, "profile", fake_profile)
    monkeypatch.setattr(timing, "real_step", fake_step)
    monkeypatch.setattr(timing, "optimizer_step", lambda *_: lambda: (order.append(("opt",)), 1.0)[1])
    costs, real, many = timing.layers_and_steps(None, None, None, torch.zeros(8, 1), torch.zeros(8), [2, 8])
    assert order == [(2, False, True, 1), (8, True, True, 1), ("step",), ("opt",),  # round 0: up, memory at 8
                     (8, False, False, 1), ("step",), ("opt",), (2, False, False, 1),  # round 1: down
                     (2, False, False, 1), (8, False, False, 1), ("step",), ("opt",)]  # round 2: up
    assert [c.seconds for c in costs[2]] == [3.0] and [c.seconds for c in costs[8]] == [8.0]  # medians
    assert costs[8][0].forward == 2.0 and costs[8][0].saved == 7  # the median round's forward, round 0's memory
    assert real == [(20.0, [9.0], 1.0), (21.0, [7.0], 1.0), (22.0, [8.0], 1.0)] and many == []
    # with a step in 4 micro-batches of 2 timed right after each round's optimizer step, beside its round's layers
    # at 2 samples
    order.clear()
    rounds = iter(range(100))
    costs, real, many = timing.layers_and_steps(None, None, None, torch.zeros(8, 1), torch.zeros(8), [2, 8], micro=4)
    assert [o for o in order if o[0] in ("step", "opt")] == [("step",), ("opt",), ("step", 4)] * 3
    assert real == [(20.0, [9.0], 1.0), (22.0, [7.0], 1.0), (24.0, [8.0], 1.0)]
    assert many == [(21.0, 4.0), (23.0, 2.0), (25.0, 3.0)]
    count = timing.micro_batches_for
    assert count(8, [2, 8]) == 4 and count(8, [1, 8]) == 8 and count(6, [2, 3, 6]) == 3
    assert count(64, [1, 64]) == 1 and count(64, [4, 64]) == 16


def test_the_profiles_real_step_runs_its_forward_under_the_runs_autocast():
    """The step factor is a real step's CPU over the layers' timed under the run's autocast: the real step must
    compute in the same dtype (it ran in float32 beside bf16 layers, and the factor came out 1.7-2.2 for 1.2-1.3)."""
    from tessel.planner import timing

    cfg = load_config(None, [*TINY["classifier"], "train.dtype=float32", "train.precision=bf16-mixed"])
    job = job_of(cfg)
    model, seen = job.build(), []
    next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(
        lambda mod, inp, out: seen.append(out.dtype))
    x, y = job.batch(4, 1)
    step = timing.real_step(model, settings_of(cfg), x, y)  # (runs its first step)
    assert step() >= 0 and seen == [torch.bfloat16, torch.bfloat16]


def test_flushed_bubble_and_async():
    """A flushed step: one slot of every stage, then m - 1 of the slowest; an asynchronous one: m slowest."""
    cfg = load_config(None, TINY["classifier"])
    profile, settings = measure(job_of(cfg), dps=(1,)), settings_of(cfg)
    ms = 1e-3
    for layer, each in zip(profile.layers, (1 * ms, 1 * ms, 3 * ms, 2 * ms)):  # per micro-batch of 2 samples
        layer.measured, layer.fixed, layer.per_sample = {}, each, 0.0
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    topo = planner.Topology(ranks=2, hosts=2, link_mbit=1e9, latency=0.0)  # boundary sends take ~no time
    bounds = ((0, 2), (2, 4))  # stages of 2 ms and 5 ms per micro-batch
    flushed = estimate(ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds), settings, profile, topo)
    free = estimate(ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds, schedule="async-predict"), settings,
                    profile, topo)
    assert math.isclose(flushed.compute, 4 * 5 * ms) and math.isclose(free.compute, 4 * 5 * ms)
    assert math.isclose(flushed.comm, free.comm) and flushed.comm < 1e-6
    assert free.bubble == 0.0  # no flush, and the slowest stage sets the pace
    # 2 ms (the first micro-batch on stage 0) + 4 x 5 ms; a (m + pp - 1) x slowest count would say 25 ms
    assert math.isclose(flushed.step - flushed.comm, (2 + 4 * 5) * ms, rel_tol=1e-3)
    assert math.isclose(flushed.bubble, 2 * ms, rel_tol=1e-3)


def test_gpipe_phases_are_paced_by_their_own_slowest_stage():
    """GPipe runs every forward, then every backward: each phase is one slot of every stage and m - 1 of that
    phase's slowest, so a stage slow in the forward and another slow in the backward cost GPipe more than 1F1B,
    whose slots hold both. Stages alike in their forward's share price the same under the two."""
    cfg = load_config(None, TINY["classifier"])
    profile, settings = measure(job_of(cfg), dps=(1,)), settings_of(cfg)
    assert all(0 < layer.forward_share < 1 for layer in profile.layers)  # timed: the forward is part of it
    ms = 1e-3
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    topo = planner.Topology(ranks=2, hosts=2, link_mbit=1e9, latency=0.0)
    bounds, m = ((0, 2), (2, 4)), 4

    def span(schedule):
        e = estimate(ParallelPlan(dp=1, pp=2, micro_batches=m, bounds=bounds, schedule=schedule), settings,
                     profile, topo)
        return e.step - e.comm

    for layer, each, share in zip(profile.layers, (1, 1, 3, 2), (0.5, 0.5, 0.1, 0.1)):
        layer.measured, layer.fixed, layer.per_sample, layer.forward_share = {}, each * ms, 0.0, share
    # forwards: stage 0 1 ms, stage 1 0.5 ms; backwards 1 ms and 4.5 ms
    assert math.isclose(span("gpipe"), ((1 + 0.5) + (m - 1) * 1 + (1 + 4.5) + (m - 1) * 4.5) * ms, rel_tol=1e-3)
    assert math.isclose(span("1f1b"), (2 + 5 + (m - 1) * 5) * ms, rel_tol=1e-3)
    for layer in profile.layers:
        layer.forward_share = 0.4
    assert math.isclose(span("gpipe"), span("1f1b"), rel_tol=1e-9)


def test_plan_command_and_saved_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "classifier", "--model.hidden", "32", "--model.in_features", "24", "--batch", "8",
            "--nproc", "4", "--hosts", "4", "--link-mbit", "200", "--latency-us", "50", "--speed", "0.5",
            "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "chosen: plan:" in text and "step ms" in text and "candidates:" in text
    assert "latency 50 us, compute 0.5x one core" in text
    plan = ParallelPlan.from_json(out.read_text())
    assert plan.world == 4
    assert saved_plan_for(load_config(None, [f"plan.source={out}"]), 4) == plan
    assert json.loads(out.read_text())["dp"] == plan.dp


def test_train_plan_auto_runs_the_winner(tmp_path, world2, monkeypatch, capsys):
    """tessel train's main with --plan auto: the trial on 2 launched workers, the plan, the run of the winner (its
    workers: the ranks of a test world)."""
    import trained

    trained.launch_in([world2], tmp_path, monkeypatch)
    out = tmp_path / "run"
    assert main(["train", "--plan", "auto", "--nproc", "2", "--model", "classifier", "--model.hidden", "32",
                 "--model.in_features", "24", "--batch", "8", "--steps", "3", "--metrics.plot", "false",
                 "--metrics.heldout", "false", "--metrics.memory", "false", "--out", str(out),
                 "--plan.trial", "true"]) == 0
    printed = capsys.readouterr().out
    assert "chosen: plan:" in printed and "tessel: calibration trial" in printed and "calibrated by a" in printed
    saved = ParallelPlan.from_json((out / "plan.json").read_text())
    ran = ParallelPlan.from_dict(json.loads((out / "summary.json").read_text())["plan"])
    assert ran.with_(tables=()) == saved.with_(bounds=ran.bounds) or ran.with_(tables=()) == saved


def test_plan_auto_under_torchrun_plans_on_rank_0_after_the_trial(tmp_path):
    """Under plain torchrun every worker takes part in the trial, rank 0 plans, and every rank runs its winner."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "tessel",
                        "train", "--plan", "auto", "--plan.trial", "true", "--model", "classifier", "--model.hidden",
                        "32", "--model.in_features", "24", "--batch", "8", "--steps", "2", "--metrics.plot", "false",
                        "--metrics.heldout", "false", "--out", "run"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("tessel: calibration trial") == 1 and "calibrated by a" in r.stdout
    assert r.stdout.count("chosen: plan:") == 1
    ran = ParallelPlan.from_dict(json.loads((tmp_path / "run" / "summary.json").read_text())["plan"])
    assert ran.world == 2


def _probe():
    from torch.distributed import distributed_c10d as c10d

    from tessel.planner import probe

    out = probe.measure(rounds=5, burst=2, bulk_rounds=3, bulk_bytes=1 << 16, wait_rounds=2)
    groups = len(c10d._world.pg_map)
    probe.measure(rounds=1, burst=1, bulk_rounds=1, bulk_bytes=1 << 12, wait_rounds=1)
    held = probe._held
    return out, len(held), held[0].mesh_dim_names, tuple(held[0].shape), len(c10d._world.pg_map) - groups


def test_probe_measures_latency_and_speed(world4):
    got = world4.run(_probe)
    # timed with a data-parallel job's mesh built and held, once per process however often the probe runs
    assert all(g[1:] == (1, ("pp", "dp", "tp"), (1, 4, 1), 0) for g in got)  # (the wait's groups destroyed)
    out = [g[0] for g in got]
    assert out[0] == out[3]  # every rank returns the group's worst
    assert out[0]["ranks"] == 4 and out[0]["latency"] > 0 and 0 < out[0]["speed"] <= 1.5
    assert 0 < out[0]["mbit"] < math.inf and 0 <= out[0]["overlap"] <= 1
    # a 4 KiB all-reduce's ring step prices a call, a one-element one's the step's tiny calls
    assert out[0]["tiny_latency"] > 0
    topo = planner.topology.probed(planner.Topology(ranks=4, hosts=4), out[0], "probed")
    assert (topo.latency, topo.tiny_latency) == (out[0]["latency"], out[0]["tiny_latency"])
    # a call's wait after compute: groups of 2 and the world, each after bursts of 0, 1, 4, 16 and 64 matmuls (the
    # CPU before each call grows with the burst; none before the first, where the wait is 0 by definition)
    wait = out[0]["wait"]
    assert [g for g, _, _ in wait] == [2] * 5 + [4] * 5 and all(v >= 0 for _, _, v in wait)
    for g in (2, 4):
        cpu = [c for s, c, _ in wait if s == g]
        assert cpu == sorted(cpu) and cpu[0] < 1e-3 < cpu[-1] and [v for s, _, v in wait if s == g][0] == 0.0
    assert topo.wait_points == tuple(tuple(p) for p in wait) and topo.quota == out[0]["quota"] >= 0
    # FSDP's all-gather and reduce-scatter, timed in groups of 2 and the world
    fsdp = out[0]["fsdp"]
    assert [g for g, _, _ in fsdp] == [2, 4] and all(0 < r < math.inf for _, *rates in fsdp for r in rates)
    assert topo.fsdp_points == tuple(tuple(p) for p in fsdp)
    # the bytes the link between the first and last ranks passes at once after idling, within the message it sent
    assert 0 <= out[0]["link_burst"] <= 8 << 20 and topo.link_burst == out[0]["link_burst"]
    # with a calibration trial (which times neither), the probe's wait and quota are kept beside it
    from tessel.planner import calibrate
    from tessel.resolve import topology_of

    cal = calibrate.Calibration(speed=0.5, per_micro=0.0, latency=1e-4, rate_mbit=100.0, overlap=0.0, seconds=1.0,
                                setup=1.0, when="now")
    both = topology_of(load_config(None, TINY["classifier"]), 4, {"wait": wait, "quota": 0.002, "fsdp": fsdp}, cal)
    assert (both.wait_points, both.quota, both.fsdp_points, both.latency) == (topo.wait_points, 0.002,
                                                                              topo.fsdp_points, 1e-4)


def _trial(base):
    from tessel.planner import calibrate

    return calibrate.run_trial(job_of(load_config(None, base)), repeats=1)


def test_calibration_trial_on_a_world_gives_a_topology(world4):
    """Every rank runs the trial and gets the same gathered record; the fit makes a valid topology from it."""
    from tessel.planner import calibrate

    out = world4.run(_trial, TINY["classifier"])
    assert out[0] == out[3] and len(out[0]["ranks"]) == 4
    # each rank times its share of the batch (as 4 data-parallel ranks hold it), in as many micro-batches as divide it
    assert out[0]["samples"] * 4 == out[0]["batch"] and out[0]["samples"] % out[0]["micro"] == 0
    kinds = ("all_reduce", "all_gather", "all_to_all", "reduce_scatter", "p2p")
    assert sorted(out[0]["collectives"]) == sorted([("tiny", 4)] + [(k, n) for k in kinds for n in (16 << 10, 4 << 20)])
    profile = measure(job_of(load_config(None, TINY["classifier"])), dps=(1,))
    cal = calibrate.fit(out[0], profile)
    topo = cal.apply(planner.Topology(ranks=4, hosts=2, link_mbit=1000))
    assert topo.speed > 0 and topo.latency >= 0 and topo.rate_mbit > 0 and topo.per_micro >= 0
    assert topo.tiny_latency == cal.tiny_latency > 0
    assert "calibrated by a" in topo.source and out[0]["when"] in topo.source


def _made_up_trial(profile, speeds, per_micro, latency, mbit, samples=8, tiny=0.0):
    """A trial record as ranks with these speeds, this per-micro-batch cost and this link would time it: steps
    from the planner's price, collectives from the ring formulas written out here (all-reduce: 2(n-1) steps
    sending 2(n-1)/n of the tensor; all-gather, all-to-all and reduce-scatter: n-1 steps sending (n-1)/n of it; a
    pipeline's exchange: 1 step sending the whole message), each the longer of its steps' latency and its bytes'
    transfer; a one-element all-reduce 2(n-1) steps at ``tiny`` (none timed where 0)."""
    from tessel.planner import calibrate

    n, ranks = len(speeds), []
    for i, speed in enumerate(speeds):
        slow = 1.0 if i == 0 else 0.5  # rank 0 is the slowest; the fit takes each collective's worst
        coll = {"tiny:4": slow * 2 * (n - 1) * tiny} if tiny else {}
        for kind, steps, share in (("all_reduce", 2 * (n - 1), 2 * (n - 1) / n), ("all_gather", n - 1, (n - 1) / n),
                                   ("all_to_all", n - 1, (n - 1) / n), ("reduce_scatter", n - 1, (n - 1) / n),
                                   ("p2p", 1, 1.0)):
            for nbytes in (16 << 10, 4 << 20):
                coll[f"{kind}:{nbytes}"] = slow * max(steps * latency, share * nbytes * 8 / (mbit * 1e6))
        ranks.append({"whole": calibrate.predicted_step(profile, samples, 1) / speed,
                      "many": calibrate.predicted_step(profile, samples // 4, 4) / speed + 3 * per_micro,
                      "collectives": coll, "overlap": 0.25 + 0.1 * i, "seconds": 1.0 + i, "setup": 0.5})
    kinds = [(k.split(":")[0], int(k.split(":")[1])) for k in ranks[0]["collectives"]]
    return {"batch": samples * n, "samples": samples, "micro": 4, "ranks": ranks, "collectives": kinds,
            "when": "2026-11-27 00:00:00Z"}


def test_calibration_fit_recovers_known_rates():
    from tessel.planner import calibrate

    profile = measure(job_of(load_config(None, TINY["classifier"])), dps=(1,))
    # (the 16 KiB exchange, one step, is bandwidth-bound on this link: its bytes take 0.33 ms against 0.15)
    trial = _made_up_trial(profile, speeds=[0.8, 0.3, 0.5, 0.9], per_micro=2e-3, latency=150e-6, mbit=400.0,
                           tiny=40e-6)
    cal = calibrate.fit(trial, profile)
    assert math.isclose(cal.speed, 0.3, rel_tol=1e-9)  # the slowest rank's
    assert math.isclose(cal.per_micro, 2e-3, rel_tol=1e-6)
    assert math.isclose(cal.latency, 150e-6, rel_tol=1e-6) and math.isclose(cal.rate_mbit, 400.0, rel_tol=1e-6)
    assert math.isclose(cal.tiny_latency, 40e-6, rel_tol=1e-9)
    assert cal.overlap == 0.25 and cal.seconds == 4.0
    topo = cal.apply(planner.Topology(ranks=4, tiny_latency=90e-6))
    assert (topo.latency, topo.tiny_latency, topo.rate_mbit) == (cal.latency, cal.tiny_latency, cal.rate_mbit)
    # a link whose bandwidth the trial's sizes cannot see is all latency, never a negative rate; a trial that timed
    # no one-element call leaves the probe's tiny latency in place
    flat = _made_up_trial(profile, speeds=[1.0, 1.0], per_micro=0.0, latency=1e-3, mbit=1e12)
    cal = calibrate.fit(flat, profile)
    assert cal.rate_mbit == math.inf and math.isclose(cal.latency, 1e-3, rel_tol=1e-9) and cal.per_micro == 0.0
    assert cal.apply(planner.Topology(ranks=2, tiny_latency=90e-6)).tiny_latency == 90e-6


def test_a_failed_trial_falls_back_with_one_line():
    from tessel.errors import CommError
    from tessel.planner import calibrate

    said = []

    def dead():
        raise CommError("all_gather on channel 'meta' timed out after 30 s: rank 3 did not answer\n=====\n"
                        "a traceback\nRuntimeError: the cause")

    assert calibrate.attempt(dead, said.append) is None
    assert len(said) == 1 and "\n" not in said[0] and "a traceback" not in said[0], said
    assert "calibration trial failed (all_gather on channel 'meta' timed out" in said[0], said
    assert "... RuntimeError: the cause); planning without it" in said[0], said
    assert calibrate.attempt(lambda: {"ok": 1}, said.append) == {"ok": 1} and len(said) == 1


def test_per_micro_batch_cost_is_priced_beyond_the_first_in_every_slot():
    """What each micro-batch beyond the first adds to a one-process step (a trial's on the job's hosts, else the
    profile's, a core's seconds, at the host's speed) is priced at (m - 1)/m of it in each slot a stage runs: m - 1
    times in one process's step, (pp + m - 1)(m - 1)/m in a flushed pipeline, m - 1 in an asynchronous one; a
    trial that measured 0 prices 0, whatever the profile's. And ``measure`` times it with the step in the most
    micro-batches, up to 16, that cut the batch into a profiled size."""
    from tessel.planner import timing

    cfg = load_config(None, TINY["classifier"])
    seen = []
    timed = timing.per_micro
    try:
        timing.per_micro = lambda real, many, micro: (seen.append((len(real), len(many), micro)), 0.003)[1]
        profile = measure(job_of(cfg), sizes=(2, 8), dps=(1,))  # the global batch, 8: 4 micro-batches of 2
    finally:
        timing.per_micro = timed
    assert seen == [(timing.ROUNDS, timing.ROUNDS, 4)] and profile.per_micro == 0.003
    settings = settings_of(cfg)
    half = planner.Topology(ranks=2, hosts=2, link_mbit=1e9, latency=0.0, speed=0.5)
    bounds = ((0, 2), (2, 4))
    plans = ((ParallelPlan(dp=1, micro_batches=4), 4), (ParallelPlan(dp=1, micro_batches=1), 1),
             (ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds), 2 + 4 - 1),
             (ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds, schedule="async"), 4),
             (ParallelPlan(dp=1, pp=2, micro_batches=1, bounds=bounds), 2))
    none = replace(half, per_micro=0.0)  # a trial that measured no cost
    trial = replace(half, per_micro=0.01)
    for plan, slots in plans:
        m, base = plan.micro_batches, estimate(plan, settings, profile, none).step
        for topo, each in ((half, 0.003 / 0.5), (trial, 0.01)):
            got = estimate(plan, settings, profile, topo).step - base
            assert math.isclose(got, slots * (m - 1) / m * each, rel_tol=1e-6, abs_tol=1e-12), plan.describe()


def test_a_ddp_step_pays_the_ring_latency_once_per_bucket_ddp_makes():
    """DDP all-reduces a whole model's gradients bucket by bucket and each all-reduce pays the ring's 2(dp - 1)
    latency steps, so the estimate's latency is that per bucket, with the count torch's own bucket assignment
    (the function DDP calls when it rebuilds its buckets) makes of the parameters in reverse. With full overlap
    only the last bucket's stays exposed; a pipeline's stage sums its gradients as one flat buffer, one latency."""
    import torch.distributed as dist

    cfg = load_config(None, TINY["transformer_lm"])
    job, settings = job_of(cfg), settings_of(cfg)
    profile = measure(job, dps=(1,))
    params = [p for p in job.build().parameters() if p.requires_grad]
    counts = []
    total = sum(p.numel() * p.element_size() for p in params)
    for mb in (0.01, 0.04, 25.0, 0.0):  # 0: tessel's own size, about 8 buckets' worth, 1 to 25 MB (rule written here)
        cap = int((mb or min(25.0, max(1.0, round(total / 2**20 / 8)))) * 2**20)
        buckets = len(dist._compute_bucket_assignment_by_size(list(reversed(params)), [cap], [False] * len(params))[0])
        counts.append(buckets)
        plan = ParallelPlan(dp=4, bucket_mb=mb)
        for overlap, lat, exposed in ((0.0, 1e-3, buckets), (1.0, 1e-7, 1)):
            slow, fast = (estimate(plan, settings, profile, planner.Topology(
                ranks=4, hosts=4, link_mbit=1e9, latency=latency, overlap=overlap)).step for latency in (lat, 0.0))
            tail = 2 * 3  # the step's loss summed over the 4 data-parallel ranks (the norm over 1 stage: no step)
            # (the bytes, about 5e-4 of the smaller latency on this link, travel while the ring steps go on)
            assert math.isclose(slow - fast, (exposed * 2 * 3 + tail) * lat, rel_tol=1e-3, abs_tol=1e-12)
    assert counts[0] > counts[1] > counts[2] == 1 and counts[3] >= 1, counts
    topo = planner.Topology(ranks=4, hosts=4, link_mbit=1e9, latency=1e-3, overlap=0.0)
    pipes = [estimate(ParallelPlan(dp=2, pp=2, micro_batches=2, bucket_mb=mb), settings, profile, topo) for mb in
             (0.01, 25.0)]
    assert pipes[0].step == pipes[1].step  # no buckets there: one flat buffer per stage, whatever DDP's size


def test_a_call_takes_the_longer_of_its_bytes_and_its_ring_steps():
    """Under a CPU quota gloo's work for a ring step goes on while the bytes travel (on the emulated hosts a 64 KiB
    all-reduce took what a 4 KiB one did until its bytes took longer), so a collective is priced at the longer of its
    bytes at the group's rate and its ring steps at the latency, not their sum; the step's one-element calls (the
    gradient norm, the loss) at the tiny latency, which a one-element all-reduce's cheaper path in gloo gets."""
    cfg = load_config(None, TINY["transformer_lm"])
    job, settings = job_of(cfg), settings_of(cfg)
    profile = measure(job, dps=(1,))
    params = sum(p.numel() for p in job.build().parameters() if p.requires_grad) * profile.elem
    sent = 2 * 3 / 4 * params  # a ring all-reduce over 4 ranks: what each sends
    plan = ParallelPlan(dp=4, bucket_mb=25.0)  # one bucket: one all-reduce of 6 ring steps a step
    lat, tiny = 1e-3, 1e-4
    tail = 2 * 3 * tiny  # the loss summed over the 4 data-parallel ranks (the norm over 1 stage: no step)

    def step(link_mbit, latency, tiny_latency):
        return estimate(plan, settings, profile, planner.Topology(
            ranks=4, hosts=4, link_mbit=link_mbit, latency=latency, tiny_latency=tiny_latency, overlap=0.0)).step

    # bytes that take no time: the ring steps
    assert math.isclose(step(1e9, lat, tiny) - step(1e9, 0.0, 0.0), 6 * lat + tail, rel_tol=1e-6)
    # bytes that take 10 times the steps' latency: the steps go on while they travel
    slow = sent * 8 / 1e6 / (60 * lat)
    assert math.isclose(step(slow, lat, tiny) - step(slow, 0.0, 0.0), tail, rel_tol=1e-6)
    assert math.isclose(step(slow, 0.0, 0.0) - step(1e9, 0.0, 0.0), 60 * lat, rel_tol=1e-3)
    # no tiny latency measured: every call at the latency
    assert math.isclose(step(1e9, lat, 0.0) - step(1e9, 0.0, 0.0), 6 * lat + 2 * 3 * lat, rel_tol=1e-6)
    # 2-D tensor parallelism on a 2 x 2 grid: its squared gradient norm (one fp64 element) summed over each axis, 2
    # ring steps each, is tiny too; one data-parallel rank and one stage: the step's tail sums over no group
    tp = [estimate(ParallelPlan(dp=1, tp=4, tp_mode="2d", tp_grid=(2, 2)), settings, profile, planner.Topology(
        ranks=4, hosts=4, link_mbit=1e9, latency=lat, tiny_latency=t, overlap=0.0)).step for t in (tiny, lat)]
    assert math.isclose(tp[1] - tp[0], 2 * 2 * (lat - tiny), rel_tol=1e-6)


def test_the_steps_tail_sums_over_each_group_not_the_world():
    """A step ends with one-element sums, each over its own group (tessel.train.tail, tessel.trainer): the squared
    gradient norm over the stages and over FSDP's shard group, the loss over the data axis (measured on 8 hosts: 4-11
    ms a step, where two calls over the world priced 20; the preemption check, over the world, is waited a step
    later). Each is 2(size - 1) ring steps at the tiny latency."""
    cfg = load_config(None, TINY["classifier"])
    job, settings = job_of(cfg), settings_of(cfg)
    profile = measure(job, dps=(1, 2, 4))

    def tail(plan, t):
        return estimate(plan, settings, profile, planner.Topology(ranks=8, hosts=8, link_mbit=1e9, latency=1e-3,
                                                                  tiny_latency=t, overlap=0.0)).comm

    for plan, steps in ((ParallelPlan(dp=4, pp=2, micro_batches=2), 2 * 1 + 2 * 3),
                        (ParallelPlan(dp=8), 2 * 7),
                        (ParallelPlan(dp=4, dp_shard=2, pp=2, micro_batches=2), 2 * 1 + 2 * 3 + 2 * 1),
                        (ParallelPlan(dp=1, pp=2, tp=4, micro_batches=1), 2 * 1)):
        assert math.isclose(tail(plan, 2e-4) - tail(plan, 1e-4), steps * 1e-4, rel_tol=1e-9), plan


def test_a_call_waits_after_the_compute_before_it():
    """Under a CPU quota a call after compute waits beyond its back-to-back time (the probe measures it per group
    size after a few burst lengths: Topology.wait_points). Each tensor-parallel call of a micro-batch waits once,
    after its share of its layer's compute; DDP's sync waits once a step, after the step's compute; a probe that
    measured no wait prices none. The wait grows with the compute before the call (linear between the lengths
    timed, held flat past the longest)."""
    cfg = load_config(None, TINY["transformer_lm"])
    job, settings = job_of(cfg), settings_of(cfg)
    profile = measure(job, dps=(1, 2))
    v = 1e-3

    def step(plan, ranks, points):
        return estimate(plan, settings, profile, planner.Topology(ranks=ranks, hosts=ranks, link_mbit=1e9,
                                                                  latency=0.0, overlap=0.0, wait_points=points))

    flat = ((2, 0.0, v), (2, 1.0, v), (4, 0.0, v), (4, 1.0, v))  # v after any compute, in groups of 2 and 4
    for tp in (ParallelPlan(dp=1, tp=2, tp_mode="1d", tp_grid=(2,), micro_batches=2),
               ParallelPlan(dp=1, tp=4, tp_mode="2d", tp_grid=(2, 2), micro_batches=2)):
        base, waited = step(tp, tp.tp, ()), step(tp, tp.tp, flat)
        # every call of a micro-batch's linears, norms, table and loss waits once; the step's gradient sums and norm
        # follow the last backward's calls with no compute between, so they do not
        per_micro = sum(n for ch, n in waited.calls.items() if ch != "tp.grads")
        assert per_micro > 0 and waited.calls.get("tp.grads", 0) > 0, waited.calls
        assert math.isclose(waited.step - base.step, per_micro * v, rel_tol=1e-9), tp.describe()
    # under bf16-mixed a half-width all-reduce is two calls, a reduce-scatter and an all-gather that follows it at
    # once: the pair waits once, as the fp32 call does
    tp = ParallelPlan(dp=1, tp=2, tp_mode="1d", tp_grid=(2,), micro_batches=2)
    half = settings_of(load_config(None, [*TINY["transformer_lm"], *BF16]))
    both = [estimate(tp, half, profile, planner.Topology(ranks=2, hosts=2, link_mbit=1e9, latency=0.0, overlap=0.0,
                                                         wait_points=pts)) for pts in ((), flat)]
    assert sum(both[1].calls.values()) > sum(step(tp, 2, flat).calls.values())  # (the pairs counted as two calls)
    assert math.isclose(both[1].step - both[0].step, step(tp, 2, flat).step - step(tp, 2, ()).step, rel_tol=1e-9)
    for dp in (2, 4):  # DDP: its sync's wait, once a step
        plan = ParallelPlan(dp=dp, bucket_mb=0.01)
        assert math.isclose(step(plan, dp, flat).step - step(plan, dp, ()).step, v, rel_tol=1e-9)
    # FSDP over 2 ranks: its gathers and reduce-scatters are charged no wait (charged one each, after a third of a
    # unit's compute, they priced the saved cells' FSDP plans a median 13% slow)
    units = profile.fsdp_calls(0, len(profile.layers))
    plan = ParallelPlan(dp=2, dp_shard=2)
    assert units > 1 and step(plan, 2, flat).step == step(plan, 2, ()).step
    # after 2 ms of a core the wait is 3 ms, twice that of after 1 ms, and no more after 10 ms; none with no compute
    rising = ((4, 0.0, 0.001), (4, 0.002, 0.003))
    topo = planner.Topology(ranks=4, hosts=4, wait_points=rising)
    assert [round(topo.wait(4, 1, c) * 1e3, 9) for c in (0.0, 0.001, 0.002, 0.010)] == [0.0, 2.0, 3.0, 3.0]
    assert math.isclose(topo.wait(4, 4, 0.008), 4 * 0.003)  # four calls, 2 ms before each
    # measured sizes 2 and 8 only: a group of 4 a third of the way between, 16 at the largest
    two = planner.Topology(ranks=16, hosts=16, wait_points=((2, 0.0, 0.001), (8, 0.0, 0.004)))
    assert math.isclose(two.wait(4, 1, 1e-3), 0.002) and math.isclose(two.wait(16, 1, 1e-3), 0.004)


def test_a_flushed_pipeline_fills_and_drains_at_a_whole_core_for_the_hosts_quota():
    """Under a CPU quota a host that has idled runs its quota at a whole core before it is throttled
    (Topology.after_idle): a flushed pipeline's fill and drain, each stage's first micro-batch forward and backward
    after waiting for its neighbour, run so; an asynchronous step does not idle, and one process's step has no fill."""
    from tessel.planner.span import pipeline

    plan = ParallelPlan(dp=1, pp=2, micro_batches=4, schedule="gpipe")
    args = dict(compute=[2.0, 5.0], forward=[1.0, 0.5], work=[2.0, 5.0], send=[(0.0, 0.0, 0.0)] * 2, hops=[0, 0])
    _, bubble = pipeline(plan, **args)
    _, faster = pipeline(plan, **args, after_idle=lambda t: 0.9 * t)  # every burst 10% shorter after idling
    assert math.isclose(bubble - faster, 0.1 * (2.0 + 5.0), rel_tol=1e-12)
    # a host of half a core with 4 ms a period at a whole core: a 6 ms burst (3 ms of a core) runs in 3 ms, a 20 ms
    # one (10 ms of a core) in 4 + 6 / 0.5 = 16 ms
    topo = planner.Topology(ranks=2, hosts=2, speed=0.5, quota=0.004)
    assert (round(topo.after_idle(0.006), 12), round(topo.after_idle(0.020), 12)) == (0.003, 0.016)
    # two ranks a host share its quota: 2 ms at a whole core, the other 8 ms of a core at half
    assert math.isclose(planner.Topology(ranks=4, hosts=2, speed=0.5, quota=0.004).after_idle(0.020),
                        0.002 + 0.008 / 0.5, rel_tol=1e-12)
    cfg = load_config(None, TINY["classifier"])
    profile, settings = measure(job_of(cfg), dps=(1,)), settings_of(cfg)
    bounds = ((0, 2), (2, 4))
    for plan, changes in ((ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds), True),
                          (ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds, schedule="gpipe"), True),
                          (ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds, schedule="async"), False),
                          (ParallelPlan(dp=2, micro_batches=4), False)):
        got = [estimate(plan, settings, profile, planner.Topology(ranks=2, hosts=2, speed=0.5, quota=q)).step
               for q in (0.0, 0.004)]
        assert (got[1] < got[0]) if changes else got[1] == got[0], (plan.describe(), got)


def test_the_probe_reads_the_hosts_cpu_quota(tmp_path, monkeypatch):
    """The probe reads the host's CFS quota from its cgroup (v1 or v2), or where the emulated cluster says it set one
    (its namespace hides the cgroup); none set or none readable: 0."""
    from tessel.errors import ConfigError
    from tessel.planner.probe import cpu_quota

    monkeypatch.delenv("TESSEL_HOST_CFS_QUOTA_US", raising=False)
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "job").mkdir(parents=True)
    (v1 / "cpu" / "job" / "cpu.cfs_quota_us").write_text("25000\n")
    (v1 / "cpu" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/job\n0::/\n")
    assert cpu_quota(proc, v1) == 0.025
    (v1 / "cpu" / "job" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(proc, v1) == 0.0
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "cpu.max").write_text("50000 100000\n")
    proc.write_text("0::/job\n")
    assert cpu_quota(proc, v2) == 0.05
    (v2 / "job" / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(proc, v2) == 0.0
    assert cpu_quota(tmp_path / "absent", v2) == 0.0
    # with the unused quota it may carry over (v2 cpu.max.burst, v1 cpu.cfs_burst_us)
    (v2 / "job" / "cpu.max").write_text("50000 100000\n")
    (v2 / "job" / "cpu.max.burst").write_text("10000\n")
    assert cpu_quota(proc, v2) == 0.06
    # a container on v1 without a cgroup namespace: its group's path (the host's) is not mounted; the mount's root is
    # its group
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("40000\n")
    proc.write_text("1:cpu,cpuacct:/docker/abc\n")
    assert cpu_quota(proc, v1) == 0.04
    # a hybrid host: no v1 cpu group readable, the v2 line holds it
    proc.write_text("1:cpu,cpuacct:/job\n0::/job\n")
    assert cpu_quota(proc, tmp_path / "v2") == 0.06
    monkeypatch.setenv("TESSEL_HOST_CFS_QUOTA_US", "2500")
    assert cpu_quota(proc, v2) == 0.0025
    monkeypatch.setenv("TESSEL_HOST_CFS_QUOTA_US", "2500.0")
    with pytest.raises(ConfigError, match="TESSEL_HOST_CFS_QUOTA_US is '2500.0'"):
        cpu_quota(proc, v2)


@pytest.mark.parametrize("field,value", [("wait_points", ((2, 0.0, math.nan),)), ("wait_points", ((1, 0.0, 0.0),)),
                                         ("wait_points", ((2, -1.0, 0.0),)), ("quota", math.nan), ("quota", -1.0),
                                         ("quota", math.inf), ("fsdp_points", ((2, 0.0, 100.0),)),
                                         ("fsdp_points", ((2, 100.0, math.inf),)), ("fsdp_points", ((1, 1.0, 1.0),))])
def test_a_topology_refuses_a_bad_wait_quota_or_fsdp_rate(field, value):
    from tessel.errors import ConfigError

    with pytest.raises(ConfigError, match=field.replace("_", " ").replace(" points", "") if field != "quota"
                       else "quota"):
        planner.Topology(ranks=2, **{field: value})


@pytest.mark.parametrize("field,value", [("link_burst", math.nan), ("link_burst", -1.0), ("link_burst", math.inf),
                                         ("per_micro", math.nan), ("per_micro", -1e-3)])
def test_a_topology_refuses_a_bad_link_burst_or_per_micro(field, value):
    from tessel.errors import ConfigError

    with pytest.raises(ConfigError, match=f"topology {field.replace('_', '-')} is {value}"):
        planner.Topology(ranks=2, **{field: value})
    assert planner.Topology(ranks=2).per_micro is None  # (not measured: the profile's is priced)


def test_a_flushed_steps_first_trip_is_each_stages_work_then_its_crossings():
    """A flushed step's first micro-batch runs each stage's work in turn, the boundary's latency and the crossings
    each way; its sends are those crossings, not a longer slot (1F1B and GPipe alike). Each further micro-batch
    takes the slowest slot, which a stage's sends still bound where they outlast its work."""
    from tessel.planner.span import pipeline

    # stage 0: 2 s of work and 3 s to send each way; stage 1: 5 s of work; 0.25 s of latency; each crossing 1 s
    args = dict(compute=[2.0, 5.0], forward=[1.0, 0.5], work=[2.0, 5.0], send=[(3.0, 3.0, 0.25), (0.0, 0.0, 0.25)],
                hops=[1.0, 1.0])
    trip = (2.0 + 0.25) + (5.0 + 0.25) + 2 * 1.0
    for schedule in ("1f1b", "gpipe"):
        comm, bubble = pipeline(ParallelPlan(dp=1, pp=2, micro_batches=1, schedule=schedule), **args)
        assert math.isclose(5.0 + comm + bubble, trip, rel_tol=1e-12), schedule
    # 1F1B in three: then two slowest slots, stage 0's sends both ways (6 s) and the latency
    comm, bubble = pipeline(ParallelPlan(dp=1, pp=2, micro_batches=3), **args)
    assert math.isclose(3 * 5.0 + comm + bubble, trip + 2 * 6.25, rel_tol=1e-12)
    # GPipe in three: the first trip's forward (1 + 0.5) and backward (1 + 4.5) halves, each with half the latency,
    # then two slowest forward slots (stage 0's activation send, 3 s) and two slowest backward ones (stage 1's 4.5 s)
    comm, bubble = pipeline(ParallelPlan(dp=1, pp=2, micro_batches=3, schedule="gpipe"), **args)
    assert math.isclose(3 * 5.0 + comm + bubble, trip + 2 * 3.125 + 2 * 4.625, rel_tol=1e-12)


def test_a_links_burst_is_taken_off_a_pipelines_first_crossings():
    """A flushed pipeline's first micro-batch crosses each boundary after its stage idled, each way: a link that
    passes ``link_burst`` bytes at once takes that much off each crossing's bytes (none below nothing), where the
    stages' boundary spans hosts; an asynchronous schedule, which does not flush, and one host's ranks keep theirs."""
    cfg = load_config(None, TINY["classifier"])
    profile, settings = measure(job_of(cfg), dps=(1,)), settings_of(cfg)
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    for layer in profile.layers:  # stages whose compute outlasts their sends, so the crossings show in the bubble
        layer.measured, layer.fixed, layer.per_sample, layer.again = {}, 1.0, 0.0, {}
    topo = planner.Topology(ranks=2, hosts=2, link_mbit=8, latency=0.0)  # 1e6 bytes/s
    bounds = ((0, 2), (2, 4))
    plan = ParallelPlan(dp=1, pp=2, micro_batches=4, bounds=bounds)
    # one crossing's bytes: a micro-batch's activation at the boundary (8 bytes an element)
    crossing = settings.global_batch / 4 * profile.layers[1].out_per_sample * 8
    assert crossing > 100
    base = estimate(plan, settings, profile, topo).step
    for burst, saved in ((crossing / 4, crossing / 4), (10 * crossing, crossing)):
        got = estimate(plan, settings, profile, replace(topo, link_burst=burst)).step
        assert math.isclose(base - got, 2 * saved / 1e6, rel_tol=1e-9), burst
    for other, t in ((plan.with_(schedule="async"), topo), (plan, replace(topo, hosts=1, local_mbit=8))):
        assert estimate(other, settings, profile, replace(t, link_burst=crossing)).step == \
            estimate(other, settings, profile, t).step


def test_sharded_gathers_lengthen_every_stage_slot():
    """FSDP gathers a unit's weights before each micro-batch's forward and backward and gloo runs them one at a time,
    so they lengthen that stage's slot: in a flushed pipeline every stage's gathers delay the first micro-batch's
    trip and the slowest stage's delay each further micro-batch (pp + m - 1 slots), not m once a step."""
    from tessel.planner import estimate as est

    cfg = load_config(None, TINY["classifier"])
    profile, settings = measure(job_of(cfg), dps=(1,)), settings_of(cfg)
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    for layer in profile.layers:  # equal stages whose compute outlasts their boundary sends
        layer.measured, layer.fixed, layer.per_sample, layer.again = {}, 1.0, 0.0, {}
    topo = planner.Topology(ranks=4, hosts=4, link_mbit=8, latency=0.0)  # 1e6 bytes/s
    bounds, m, s = ((0, 2), (2, 4)), 4, 2
    plan = ParallelPlan(dp=2, dp_shard=s, pp=2, micro_batches=m, bounds=bounds)
    # one micro-batch's gathers on stage k: every weight gathered from its s ranks twice (forward, backward), 8 bytes
    gathers = [2 * (s - 1) * sum(layer.params for layer in profile.layers[lo:hi]) / s * 8 / 1e6 for lo, hi in bounds]
    sync = est._sharded_sync
    try:
        est._sharded_sync = lambda *a, **k: (lambda out, g, t: (out, 0.0, t))(*sync(*a, **k))
        without = est.estimate(plan, settings, profile, topo).step
    finally:
        est._sharded_sync = sync
    got = est.estimate(plan, settings, profile, topo).step
    assert min(gathers) > 0.01
    assert math.isclose(got - without, sum(gathers) + (m - 1) * max(gathers), rel_tol=1e-9), (got, without, gathers)
    # where the probe measured FSDP's gathers at half the link in pairs and its reduce-scatter at a quarter, each
    # moves at that: the gathers take twice as long, and the step's reduce-scatter (the busiest stage's, once a
    # step: (s - 1)/s of its weights, 8 bytes each) four times
    slow = replace(topo, fsdp_points=((2, 4.0, 2.0),))
    try:
        est._sharded_sync = lambda *a, **k: (lambda out, g, t: (out, 0.0, t))(*sync(*a, **k))
        without_slow = est.estimate(plan, settings, profile, slow).step
    finally:
        est._sharded_sync = sync
    assert math.isclose(est.estimate(plan, settings, profile, slow).step - without_slow,
                        2 * (sum(gathers) + (m - 1) * max(gathers)), rel_tol=1e-9)
    # once a step, the busiest stage's reduce-scatter ((s - 1)/s of its weights, 8 bytes each), at the quarter
    scatter = max((s - 1) * sum(layer.params for layer in profile.layers[lo:hi]) / s * 8 for lo, hi in bounds) / 1e6
    assert math.isclose(without_slow - without, 3 * scatter, rel_tol=1e-9)


def test_tensor_parallel_compute_is_the_blocks_timed_on_stand_in_groups():
    """A tensor-parallel rank's compute is its layers as timed on stand-in groups (what a rank's block costs at
    these widths), not the plain layer's over tp; torch's peer, whose layers are not tessel's, keeps the share."""
    from tessel.planner.profile import TensorLayer

    cfg = load_config(None, TINY["transformer_lm"])
    profile, settings = measure(job_of(cfg), dps=(1,)), settings_of(cfg)
    dry = profile.tp_seconds("3d", (2, 2, 1), False)
    assert len(dry) == len(profile.layers) and all(layer.time[1] >= 0 for layer in dry)
    assert dry[1].time == dry[2].time  # the two equal blocks: the second taken to cost what the first did
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    topo = planner.Topology(ranks=4, hosts=4, link_mbit=1e9, latency=0.0)
    ms = 1e-3
    lines = [(1 * ms, 0.5 * ms), (2 * ms, 1 * ms), (2 * ms, 1 * ms), (3 * ms, 0.25 * ms)]  # (fixed, per sample)
    profile._shards[("timed", "3d", (2, 2, 1), False)] = [TensorLayer((0, 0), (0, 0), time=t) for t in lines]
    plan = ParallelPlan(dp=1, tp=4, tp_mode="3d", tp_grid=(2, 2, 1), micro_batches=2)
    samples = settings.global_batch / 2  # a micro-batch
    want = 2 * sum(a + b * samples for a, b in lines)
    assert math.isclose(estimate(plan, settings, profile, topo).compute, want, rel_tol=1e-9)
    peer = ParallelPlan(dp=1, tp=4, tp_mode="torch-1d", tp_grid=(4,), micro_batches=2)
    share = 2 * sum(layer.seconds(samples) for layer in profile.layers) / 4
    assert math.isclose(estimate(peer, settings, profile, topo).compute, share, rel_tol=1e-9)


def test_recompute_is_priced_at_what_the_profile_timed_it_adding():
    """A recomputed layer costs what the profile measured recomputing it adding (per kind), not an assumed third;
    and the planner's profile holds the same memory per layer as a run's own (measure_memory), field for field."""
    from tessel.planner.profile import measure_memory

    cfg = load_config(None, TINY["transformer_lm"])
    job, settings = job_of(cfg), settings_of(cfg)
    profile = measure(job, dps=(1,))
    # each kind timed at the smallest and the largest micro-batch the profile took (1 sample and the global batch)
    sizes = {1, settings.global_batch}
    assert all(set(layer.again) == {"layers", "selective"} and all(set(at) == sizes for at in layer.again.values())
               and min(v for at in layer.again.values() for v in at.values()) >= 0 for layer in profile.layers)
    run = measure_memory(job, settings.global_batch)
    for mine, theirs in zip(profile.layers, run.layers):
        for f in ("saved_per_sample", "work_per_sample", "ahead_per_sample", "selective_per_sample"):
            assert getattr(mine, f) == getattr(theirs, f), (mine.name, f)
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    ms = 1e-3
    for layer, share in zip(profile.layers, (0.5, 1.0, 2.0, 0.25)):
        layer.measured, layer.fixed, layer.per_sample = {}, 1 * ms, 0.0
        layer.again = {"layers": {settings.global_batch: share}, "selective": {settings.global_batch: share / 10}}
    topo = planner.Topology(ranks=1, hosts=1, link_mbit=1e9, latency=0.0)
    for kind, scale in (("none", 0.0), ("layers", 1.0), ("selective", 0.1)):
        got = estimate(ParallelPlan(dp=1, recompute=kind), settings, profile, topo).compute
        assert math.isclose(got, sum(1 + scale * s for s in (0.5, 1.0, 2.0, 0.25)) * ms, rel_tol=1e-9), kind
    # a kind the profile did not time: its assumed share
    for layer in profile.layers:
        layer.again = {}
    got = estimate(ParallelPlan(dp=1, recompute="layers"), settings, profile, topo).compute
    assert math.isclose(got, 4 * (1 + 1 / 3) * ms, rel_tol=1e-9)


def test_recompute_share_is_taken_at_the_micro_batch_size():
    """A recompute's share is priced at the plan's micro-batch: as timed where it was timed, between two timed
    sizes the seconds it adds on the line through theirs over the layer's seconds there, and below the smallest
    timed size that size's share (a recompute's fixed cost per call makes the share fall as the micro-batch
    grows)."""
    cfg = load_config(None, TINY["classifier"])
    settings = settings_of(cfg)
    profile = measure(job_of(cfg), dps=(1,))
    profile.step_factor, profile.optimizer_per_elem, profile.per_micro = 1.0, 0.0, 0.0
    b, ms = settings.global_batch, 1e-3
    small = b // 4
    for layer in profile.layers:  # 1 ms + 0.5 ms a sample; recomputing adds 2 ms at a quarter batch, 0.5 of it at b
        layer.measured, layer.fixed, layer.per_sample = {}, 1 * ms, 0.5 * ms
        layer.again = {"layers": {small: 2 * ms / (1 * ms + 0.5 * ms * small), b: 0.5}}
    topo = planner.Topology(ranks=1, hosts=1, link_mbit=1e9, latency=0.0)
    n = len(profile.layers)
    at_b = 0.5 * (1 + 0.5 * b)  # ms recomputing adds at the global batch
    between = 2.0 + (at_b - 2.0) * (b / 2 - small) / (b - small)
    below = 2.0 / (1 + 0.5 * small) * (1 + 0.5 * b / 8)  # a micro-batch under the smallest timed: its share
    for m, added in ((1, at_b), (4, 2.0), (2, between), (8, below)):
        got = estimate(ParallelPlan(dp=1, micro_batches=m, recompute="layers"), settings, profile, topo).compute
        want = m * n * (1 + 0.5 * b / m + added) * ms
        assert math.isclose(got, want, rel_tol=1e-9), (m, got, want)


def test_paper_projections():
    from tessel.bench import paper

    rows, text = paper.parallax()
    # the 800K-word tables are what dense data parallelism all-reduces and the hybrid moves by rows
    assert rows["hybrid"].bytes["dp.dense"] < rows["dense"].bytes["dp.dense"] / 10
    assert rows["chosen"].step <= rows["hybrid"].step and "6.02x" in text
    rows, text = paper.tacc()
    assert set(rows) == {"1d", "2d", "3d"} and all(e.plan.tp == 64 for e in rows.values())
    # 1-D all-reduces whole activations per linear, 3-D moves (q-1)/q^3 blocks: fewer bytes per rank
    assert rows["3d"].bytes["tp"] < rows["1d"].bytes["tp"]


def test_saved_plan_that_does_not_fit_the_model_is_one_line(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(ParallelPlan(dp=1, pp=8).to_json())  # the default Transformer has 4 pipeline layers
    assert main(["train", "--plan", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pp=8 stages but the model has only 4 pipeline layers" in err, err


PLANS8 = {  # stage boundaries in a 2-D/3-D block, and a middle stage that sends both ways
    "transformer_lm": [ParallelPlan(dp=1, pp=2, tp=4, tp_mode="3d", tp_grid=(2, 2, 1), micro_batches=2),
                       ParallelPlan(dp=1, pp=2, tp=4, tp_mode="2d", tp_grid=(2, 2), micro_batches=2),
                       ParallelPlan(dp=1, tp=8, tp_mode="3d", tp_grid=(2, 2, 2))],
    "classifier": [ParallelPlan(dp=1, pp=2, tp=4, tp_mode="3d", tp_grid=(2, 2, 1), micro_batches=2),
                   ParallelPlan(dp=1, pp=4, tp=2, tp_grid=(2,), micro_batches=4)],
}


@pytest.mark.parametrize("model", sorted(PLANS8))
def test_predicted_bytes_equal_measured_on_8_ranks(world8, model):
    base = TINY[model]
    cfg = load_config(None, base)
    profile = measure(job_of(cfg), dps=(1,))
    topo = planner.Topology(ranks=8, hosts=8, link_mbit=1000)
    for plan in PLANS8[model]:
        est = estimate(plan.with_(sparse=policy_of(cfg)), settings_of(cfg), profile, topo)
        _same_counts(est, world8.run(_step_bytes, base, est.plan.to_json()), plan)


def test_bench_plan_skips_a_cell_no_plan_fits_with_one_line(tmp_path, monkeypatch, capsys):
    """A cell whose world the model cannot be cut over (the LSTM's 3 pipeline layers on 5 hosts, its batch of 32
    over no dp of 5) is skipped with the planner's reason, and the other cells go on (it raised StopIteration)."""
    from tessel.bench import plan_check
    from tessel.planner.choose import Planned

    monkeypatch.setattr(plan_check, "probe_cell", lambda *a: {"latency": 1e-3, "speed": 0.4, "mbit": 130.0,
                                                               "overlap": 0.0})
    monkeypatch.setattr(plan_check.calibrate, "choose_calibrated", lambda job, topo, *a: Planned(
        [], [(ParallelPlan(dp=1, pp=5), "pp=5 stages but the model has only 3 pipeline layers")], topo(None), None,
        0.0, []))
    assert plan_check.run(["lstm_lm"], [5], ["150mbit"], tmp_path, 1, 1, {}) == []
    assert "lstm_lm, 5 hosts, 150mbit: no plan fits 5 ranks for this model: pp=5 stages but the model has only 3 " \
           "pipeline layers; the cell is skipped" in capsys.readouterr().out


def test_bench_plan_reprices_saved_candidates_against_their_measurements(tmp_path, capsys):
    """`tessel bench plan --report-only --reprice`: today's planner on a saved run's plans and probed topology;
    the measurements and results.json stay as they were."""
    folder = tmp_path / "plans" / "classifier-h2-1gbit"
    folder.mkdir(parents=True)
    plan = ParallelPlan(dp=1, pp=2, micro_batches=2, bounds=((0, 2), (2, 5)))
    (folder / "dp1-pp2-tp1-1f1b-m2.json").write_text(plan.to_json())
    row = {"model": "classifier", "hosts": 2, "rate": "1gbit", "rank": 1, "plan": "dp1 pp2 tp1 1f1b m2",
           "predicted": 9.0, "compute": 3.0, "comm": 3.0, "bubble": 3.0, "measured": 0.05, "runs": [0.05],
           "planning_s": 1.0, "bytes_predicted": {"pp": 1}, "bytes_measured": {"pp": 1}, "latency": 1e-4,
           "speed": 1.0, "rate_mbit": 900.0, "overlap": 0.0}
    saved = json.dumps({"command": "tessel bench plan --hosts 2", "rows": [row]})
    (tmp_path / "results.json").write_text(saved)
    assert main(["bench", "plan", "--report-only", "--reprice", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "re-priced by `tessel bench plan --report-only --reprice" in text and "Re-priced:" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| classifier, 2 hosts, 1gbit | 1 |"))
    assert "| 9000 (3000 / 3000 / 3000) |" not in line and "| 50 (50) |" in line  # priced again, measured kept
    assert (tmp_path / "results.json").read_text() == saved


def test_bench_plan_report_prices_the_same_runs_with_and_without_the_trial():
    """A calibrated run's report gives the headline of its predictions and of the probe's on the same runs."""
    from tessel.bench.plan_check import markdown

    def row(rank, predicted, probe, measured):
        return {"model": "classifier", "hosts": 2, "rate": "1gbit", "rank": rank, "plan": f"p{rank}",
                "predicted": predicted, "predicted_probe": probe, "compute": 0.0, "comm": 0.0, "bubble": 0.0,
                "measured": measured, "runs": [measured] * 3, "rounds": {0: measured, 1: measured, 2: measured},
                "planning_s": 1.0, "bytes_predicted": {}, "bytes_measured": {}, "calibrated": True,
                "trial_s": 2.5 + rank}

    text = markdown([row(1, 0.10, 0.05, 0.11), row(2, 0.20, 0.30, 0.19)], "tessel bench plan")
    assert "Over all cells: median absolute error 7%, worst 9%, 2 candidates" in text
    assert "The same runs priced without the trial (the probe's rates, as before): median absolute error 56%, " \
           "worst 58%" in text
    assert "The calibration trial took 3.5–4.5 s per cell and model." in text



def test_a_limit_given_to_the_run_counts_fsdps_units_beside_the_tensors_on_the_cpu():
    """``plan.memory_gib``'s check (before the workers and in them) adds what FSDP's units hold beside their
    tensors where a rank's memory is the host's, as the planner does: 0.68 MiB a unit on the CPU, none on a GPU
    and none unsharded; a plan whose tensors fit but whose units do not is refused, saying so."""
    from tessel.errors import PlanError
    from tessel.preflight import check_fits, held_beside

    cfg = load_config(None, TINY["transformer_lm"] + ["parallel.device=cpu"])
    sharded, unit = ParallelPlan(dp=4, dp_shard=4), 0.68 * 2**20
    chain = 2 + cfg.model.layers  # the embedding, the blocks, the head
    assert held_beside(cfg, sharded) == [unit * (chain + 1)]  # (+ the root)
    piped = ParallelPlan(dp=2, dp_shard=2, pp=2, bounds=((0, 1), (1, chain)))
    assert held_beside(cfg, piped) == [unit * 2, unit * chain]
    assert held_beside(cfg, ParallelPlan(dp=4)) == [0.0]
    assert held_beside(load_config(None, TINY["transformer_lm"] + ["parallel.device=cuda"]), sharded) == [0.0]
    limit = 2**30 * 1e-3  # plan.memory_gib=0.001: about 1.02 MiB; the units alone need 5 x 0.68 MiB
    check_fits(sharded, [limit * 0.5], 1e-3)  # the tensors alone fit
    with pytest.raises(PlanError, match=r"MiB of it beside its tensors for FSDP's units\), over plan.memory_gib"):
        check_fits(sharded, [limit * 0.5], 1e-3, held_beside(cfg, sharded))
