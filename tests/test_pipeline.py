"""Pipeline parallelism: flushed schedules equal single-process training; asynchronous ones converge.

Parity (gpipe, 1f1b, torch's two schedules): fp64, clipping on, several optimizer steps; the loss, every
gradient (captured just before each optimizer step) and every parameter after the steps agree with one
process training the whole model on the same global batch, at pp=2, pp=4 and pp=2 x dp=2.
"""

import pytest
import torch

from composed import planned
from steps import TorchReference
from tessel import comm
from tessel.chain import chain_of
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.errors import PlanError
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.pipeline.partition import balance, parse_split, plan_stages
from tessel.pipeline.predict import StageWeights, staleness
from tessel.pipeline.schedules import ahead, async_ops, drain_ops, sync_ops
from tessel.plan import ParallelPlan
from tessel.settings import Settings
from tessel.train.build import build, build_data

SMALL = {
    "transformer_lm": ["model.dim=16", "model.layers=2", "model.heads=2", "data.vocab_size=64", "data.seq_len=8"],
    "classifier": ["model.in_features=24", "model.hidden=32", "model.layers=3", "model.classes=5"],
}
ATOL = 1e-10


def _grads_before_step(optimizer, names):
    seen = []
    optimizer.register_step_pre_hook(
        lambda opt, a, k: seen.append({n: p.grad.detach().clone() for n, p in names() if p.grad is not None}))
    return seen


def _setup(name, schedule, pp, optimizer, micro, extra=()):
    cfg = load_config(None, [f"model.name={name}", *SMALL[name], "train.dtype=float64", "train.global_batch=8",
                             f"train.micro_batches={micro}", f"train.optimizer={optimizer}", "train.lr=0.05",
                             "train.warmup=2", "train.clip=0.5", "train.steps=4", f"parallel.pp={pp}",
                             f"pipeline.schedule={schedule}", *extra])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    vocab = getattr(data, "vocab_size", 0)
    torch.manual_seed(1)
    dtype = getattr(torch, cfg.train.dtype)
    model = build(cfg, vocab).to(dtype)
    loader = ShardedLoader(data, 8, mesh.get_local_rank("dp"), plan.dp)
    x, y = ShardedLoader(data, 8, mesh.get_local_rank("dp"), plan.dp).next_batch()
    built = parallelize(model, plan, mesh, [(x.to(dtype) if x.is_floating_point() else x, y)], settings)
    return cfg, plan.dims, data, vocab, loader, built


def check_parity(name, schedule, pp, optimizer, micro, steps=3, extra=()):
    cfg, dims, data, vocab, loader, built = _setup(name, schedule, pp, optimizer, micro, extra)
    torch.manual_seed(1)
    ref = build(cfg, vocab).double()
    ref_engine = TorchReference(ref, cfg.train)
    ref_loader = ShardedLoader(data, 8, 0, 1)
    mine = dict((n.removeprefix("root."), p) for n, p in built.engine.stage.runner.named_parameters())
    grads = _grads_before_step(built.optimizer, lambda: mine.items())
    # a tied weight (the token table and the head) has both names in the reference, one on each stage here
    every = lambda: ref.named_parameters(remove_duplicate=False)  # noqa: E731
    ref_grads = _grads_before_step(ref_engine.optimizer, every)
    for step in range(steps):
        x, y = loader.next_batch()
        rx, ry = ref_loader.next_batch()
        f = (lambda t: t.double() if t.is_floating_point() else t)
        res = built.engine.step(f(x), y, step)
        ref_res = ref_engine.step(f(rx), ry, step)
        mean = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(mean, "meta", group=built.engine.tail.dp_group)
        if built.engine.stage.last:  # the only stage that computes the loss
            assert abs(float(mean) / dims.dp - ref_res.loss) < ATOL, (float(mean) / dims.dp, ref_res.loss)
        else:
            assert res.loss == 0.0
        assert abs(res.grad_norm - ref_res.grad_norm) < ATOL
        for n, g in grads[step].items():
            torch.testing.assert_close(g, ref_grads[step][n], rtol=0, atol=ATOL, msg=f"grad {n} step {step}")
    ref_params = dict(every())
    assert mine and len(mine) < len(ref_params) or pp == 1
    for n, p in mine.items():
        torch.testing.assert_close(p, ref_params[n], rtol=0, atol=ATOL, msg=n)
    torch.manual_seed(1)
    init = dict(build(cfg, vocab).double().named_parameters(remove_duplicate=False))
    assert max(float((p - init[n]).abs().max()) for n, p in mine.items()) > 1e-3  # it really trained
    return sorted(mine)


PARITY = [("classifier", "gpipe", "sgd", 4), ("classifier", "1f1b", "adamw", 4),
          ("transformer_lm", "1f1b", "adamw", 2), ("transformer_lm", "gpipe", "sgd", 4)]


@pytest.mark.parametrize("name,schedule,optimizer,micro", PARITY)
def test_parity_pp2(world2, name, schedule, optimizer, micro):
    owned = world2.run(check_parity, name, schedule, 2, optimizer, micro)
    assert not set(owned[0]) & set(owned[1])  # each parameter lives on one stage


def test_tied_table_and_head_on_two_stages_stay_one_weight(world2):
    """The token table on the first stage and the head tied to it on the last: each stage keeps a copy, their
    gradients are summed between the two before the update (Megatron's way), so both equal the one weight of a
    single process; an asynchronous schedule, which updates each stage at its own time, is refused."""
    owned = world2.run(check_parity, "transformer_lm", "1f1b", 2, "adamw", 2, 3, ("model.tie_embeddings=true",))
    assert "tok_emb.weight" in owned[0] and "head.weight" in owned[1]
    for why in world2.run(refusal, "transformer_lm", "async-predict", 2, "adamw", 2, ("model.tie_embeddings=true",)):
        assert "a tied weight" in why and "updates on each stage at its own time" in why and "\n" not in why


def refusal(*args) -> str:
    """The one-line PlanError that composing refuses with (caught here, so the world stays usable)."""
    try:
        _setup(*args)
    except PlanError as e:
        return str(e)
    return "not refused"


def test_nadamw_with_its_betas_and_decoupled_decay_matches_one_process_under_pp2(world2):
    """NAdamW (the Nesterov method's optimizer) at a beta1 and weight decay of its own: torch's NAdam in the
    reference, built from the same config values, so a setting tessel dropped would show."""
    own = ("train.beta1=0.99", "train.beta2=0.99", "train.weight_decay=0.1", "train.momentum_decay=0.5")
    world2.run(check_parity, "classifier", "1f1b", 2, "nadamw", 2, 3, own)


@pytest.mark.parametrize("name,schedule,optimizer,micro", PARITY[:2] + [("transformer_lm", "1f1b", "adamw", 4)])
def test_parity_pp4(world4, name, schedule, optimizer, micro):
    world4.run(check_parity, name, schedule, 4, optimizer, micro)


@pytest.mark.parametrize("schedule", ["1f1b", "torch-1f1b"])
def test_parity_pp2_dp2(world4, schedule):
    owned = world4.run(check_parity, "classifier", schedule, 2, "adamw", 2)
    assert owned[0] == owned[1] and owned[2] == owned[3]  # mesh (pp, dp): ranks 0,1 hold stage 0


def test_torch_gpipe_at_one_micro_batch_matches_single_process(world2):
    # SpecTrain's regime (one micro-batch per step): torch's GPipe runs it, its Schedule1F1B refuses it
    world2.run(check_parity, "classifier", "torch-gpipe", 2, "sgd", 1)
    with pytest.raises(PlanError, match="torch-1f1b needs train.micro_batches >= pp"):
        ParallelPlan(dp=1, pp=2, schedule="torch-1f1b", micro_batches=1).check(Settings(global_batch=8))


@pytest.mark.parametrize("schedule", ["torch-gpipe", "torch-1f1b", "torch-interleaved-1f1b", "torch-interleaved-zb",
                                      "torch-zbv"])
def test_torch_schedules_match_single_process(world2, schedule):
    # the interleaved and zero-bubble ones cut the 4 layers into 4 stages, two per rank: round-robin (0, 2 on
    # rank 0) or in a V (ZBV: 0 and 3 on rank 0); the two-stage ones are given their cut (a cut from the layers'
    # timings can fall either side of a layer when four equal layers time unevenly)
    two = schedule in ("torch-gpipe", "torch-1f1b")
    owned = world2.run(check_parity, "classifier", schedule, 2, "sgd", 2, 3, ("pipeline.split=2,2",) if two else ())
    layers = [sorted({n.split(".")[1] for n in names}) for names in owned]
    assert layers == {"torch-gpipe": [["0", "2"], ["4", "6"]], "torch-1f1b": [["0", "2"], ["4", "6"]],
                      "torch-zbv": [["0", "6"], ["2", "4"]]}.get(schedule, [["0", "4"], ["2", "6"]])


def check_pp_bytes(schedule, micro):
    cfg, dims, data, vocab, loader, built = _setup("classifier", schedule, 2, "sgd", micro, ["model.layers=3"])
    x, y = loader.next_batch()
    comm.counter.end_step()
    built.engine.step(x.double(), y, 0)
    got = comm.counter.end_step().get("pp", {})
    # an asynchronous stage 0 still owes the last backward, whose gradient is already sent: take it, or it stays
    # queued on the pp group, which on 2 ranks is the world's group, and the next pipeline on it reads it first
    built.engine.drain(1)
    return got


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "async-predict"])
def test_pp_bytes_exact(world2, schedule):
    # stage 0 sends each micro-batch's activation (2 samples x 32 fp64 = 512 B) and gets its gradient back
    # (async: stage 0 takes the newest micro-batch's gradient, already sent, only in the next step)
    got = world2.run(check_pp_bytes, schedule, 4)
    n_back = 4 if schedule != "async-predict" else 3
    assert got[0] == {"sent": 4 * 512, "recv": n_back * 512}
    assert got[1] == {"sent": 4 * 512, "recv": 4 * 512}


def train_async(schedule, variant, steps, optimizer):
    extra = [f"pipeline.predict={variant}", "train.dtype=float32", "model.hidden=64", "train.clip=0"]
    cfg, dims, data, vocab, loader, built = _setup("classifier", schedule, 4, optimizer, 1, extra)
    built.engine.lr_of = built.settings.with_(lr=0.05, warmup=0, steps=steps).lr_at
    losses, held = [], []  # held: sends still kept after each step (their tensors alive)
    for step in range(steps):
        x, y = loader.next_batch()
        losses.append(built.engine.step(x.float(), y, step).loss)
        held.append(len(built.engine.stage.pending))
    built.engine.drain(steps)
    stage_bytes = sum(p.numel() * p.element_size() for p in built.engine.params.values())
    return (losses, built.engine.peak_kept_bytes, built.engine.updates, stage_bytes, held, built.engine.stage.pending,
            built.describe(), built.plan.bounds)


def test_async_schedules_converge(world4):
    """No flush, stale weights: each variant still learns the task, and drain() empties the pipeline."""
    steps = 60
    flushed = world4.run(train_async, "1f1b", "v1", steps, "sgd")
    sync = flushed[3][0]  # the last stage has the loss
    # sends are retired: none outlives a flushed step, and a stream keeps at most 2 x (4 stages + 1 micro-batch)
    assert all(r[4] == [0] * steps for r in flushed)
    assert "--pipeline.split" not in flushed[0][6]  # a flushed schedule computes the same on every cut
    for schedule, variant in [("async", "v1"), ("async-stash", "v1"), ("async-predict", "v1"),
                              ("async-predict", "v2")]:
        res = world4.run(train_async, schedule, variant, steps, "sgd")
        losses = res[3][0]
        assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:5]) / 5, (schedule, losses)
        assert sum(losses[-10:]) / 10 < 1.5 * sum(sync[-10:]) / 10 + 0.05, (schedule, losses, sync)
        assert all(r[2] == steps for r in res)  # every mini-batch was applied on every stage after the drain
        # the profiled cut is part of an asynchronous run's math: the plan prints the split that gives it again
        said = res[0][6].split("--pipeline.split ")[1].split()[0]
        assert f"{schedule}: the cut sets how stale each layer runs" in res[0][6]
        assert parse_split(said, 4, 4, ["a", "b", "c", "d"]) == [tuple(b) for b in res[0][7]]
        assert all(max(r[4]) <= 10 and r[5] == [] for r in res), [r[4] for r in res]
        kept = [r[1] for r in res]
        if schedule == "async-stash" or variant == "v2":
            # stage k keeps one weight copy per mini-batch in flight, N - k of them at the peak; the last stage
            # none: nothing updates its weights between a forward and its backward, so it runs on the live ones
            assert kept == [(4 - k) * r[3] if k < 3 else 0 for k, r in enumerate(res)]
        else:
            assert kept == [0, 0, 0, 0]


# -- single-process pieces --------------------------------------------------------------------------------

def test_schedules_ops():
    assert sync_ops("gpipe", 1, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert sync_ops("1f1b", 3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    # the endless stream cut into steps is the same sequence as one long run
    full = async_ops(1, 4, 0, 6)
    assert async_ops(1, 4, 0, 2) + async_ops(1, 4, 2, 4) == full
    assert full + drain_ops(1, 4, 6) == full + [("B", 4), ("B", 5)]
    # one update per mini-batch (SpecTrain): the forward is N - k - 1 updates ahead of its own update
    assert [ahead(i, 1, 1, 4) for i in range(4)] == [0, 1, 2, 2] and ahead(9, 1, 3, 4) == 0
    # one update per 4 micro-batches: only the first N - k - 1 micro-batches of a step are one update behind
    assert [ahead(i, 4, 1, 4) for i in range(4, 12)] == [1, 1, 0, 0, 1, 1, 0, 0]
    assert staleness(0, 4, "v1") == (3, 0) and staleness(3, 4, "v1") == (1, 1) and staleness(1, 4, "v2") == (2, 0)


def test_balance_minimises_slowest_stage():
    assert balance([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert balance([4, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert balance([1, 2, 3, 4, 5, 6], 3) == [(0, 3), (3, 5), (5, 6)]
    with pytest.raises(PlanError, match="valid: pp between 1 and 2"):
        balance([1, 1], 3)
    with pytest.raises(PlanError, match="e.g. '2,1'"):
        parse_split("1,1", 3, 2, ["a", "b", "c"])
    assert parse_split("1,2", 3, 2, ["a", "b", "c"]) == [(0, 1), (1, 3)]


def test_equal_layers_are_timed_alike_and_the_first_and_last_apart(monkeypatch):
    """With ``pool`` every layer runs, and equal layers (same modules and shapes, an input that needs a gradient)
    take the median of their times. The first layer (its input is data, no gradient) and the last (the loss
    follows it) stand apart. The times here are a fake clock's, so the expected costs are exact."""
    from tessel.models import DenseClassifier
    from tessel.pipeline import partition

    m = DenseClassifier(in_features=16, hidden=16, layers=4, classes=4)  # chain: 4 x (Linear 16x16, ReLU), head
    took = iter([0.05, 0.10, 0.03, 0.08, 0.04])  # one timed run per layer (each over the 20 ms a layer needs)
    calls = iter(range(10**6))
    now = [0.0, 0.0]  # the run's start and its duration

    def clock():  # a run's start, its forward's end a quarter of its duration later, then its end
        k = next(calls) % 3
        if k == 0:
            now[1] = next(took)
            return now[0]
        if k == 1:
            return now[0] + now[1] / 4
        now[0] += now[1]
        return now[0]

    monkeypatch.setattr(partition.time, "thread_time", clock)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    got = partition.profile(m, chain_of(m), x, y, repeats=1, pool=True)
    assert [c.seconds for c in got] == pytest.approx([0.05, 0.08, 0.08, 0.08, 0.04])  # 1-3: median of 0.10, 0.03, 0.08
    assert [c.forward for c in got] == pytest.approx([0.0125, 0.02, 0.02, 0.02, 0.01])  # the forwards pooled alike


def test_plan_profiles_and_prints():
    cfg = load_config(None, ["model.name=transformer_lm", *SMALL["transformer_lm"]])
    torch.manual_seed(0)
    m = build(cfg, 64)
    x = torch.randint(0, 64, (2, 8))
    plan = plan_stages(m, chain_of(m), x, x, 2)
    assert [c.name for c in plan.costs] == ["embed", "blocks.0", "blocks.1", "head"]
    # the head's layer hands on hidden states (T, dim): its loss runs the head fused (models.vocab_head)
    assert plan.costs[1].out_shape == (8, 16) and plan.costs[-1].out_shape == (8, 16)
    assert "pipeline plan: 2 stages" in plan.describe() and plan.imbalance() >= 1.0
    given = plan_stages(m, chain_of(m), x, x, 2, split="3,1")
    assert given.bounds == [(0, 3), (3, 4)] and given.given
    # a sampled softmax is the loss of the last layer, which owns it (so the last stage keeps its tables)
    lstm = build(load_config(None, ["model.name=lstm_lm", "model.softmax=sampled", "model.num_sampled=8"]), 64)
    sampled = chain_of(lstm)
    assert sampled.names == ["embedding", "lstm"] and "head" in sampled.layers[-1].owns
    x = torch.randint(0, 64, (2, 8))
    assert sampled.loss(sampled.layers[1].run(lstm, sampled.layers[0].run(lstm, x)), x).dim() == 0


def test_predict_v1_backward_uses_rebuilt_weights():
    """v1: forward at W − s_f·η·v, backward at the weights predicted again then, with no copy kept."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin.weight.grad = torch.ones_like(lin.weight)
    opt.step()  # momentum buffer = ones
    w = StageWeights(dict(lin.named_parameters()), opt, "predict", stage=2, stages=4, variant="v1")
    assert staleness(2, 4, "v1") == (2, 1)
    x = torch.randn(5, 3, requires_grad=True)
    weights, leaves, ctx, kept = w.make(ahead=1)  # N - k - 1 = 1 for stage 2 of 4
    with ctx:
        out = torch.func.functional_call(lin, weights, (x,))
    w_fwd = lin.weight.detach() - 0.2 * torch.ones(2, 3)
    torch.testing.assert_close(out, x @ w_fwd.t())
    assert kept is None  # no copy of the weights stays with the graph
    del weights
    with torch.no_grad():
        lin.weight.add_(1.0)  # an update lands between forward and backward
    out.sum().backward()
    w_bwd = lin.weight.detach() - 0.1 * torch.ones(2, 3)
    torch.testing.assert_close(x.grad, torch.ones(5, 2) @ w_bwd)
    torch.testing.assert_close(leaves["weight"].grad, torch.ones(5, 2).t() @ x.detach())


def test_predict_v1_rebuilds_a_weight_that_is_a_view():
    """A parameter that sits at an offset inside a larger storage (a block of a bigger tensor) is rebuilt from its
    own elements, not from the storage's start."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    big = torch.randn(4, 3)
    lin.weight = torch.nn.Parameter(big[2:])  # rows 2..3: contiguous, storage offset 6
    assert lin.weight.storage_offset() == 6
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin.weight.grad = torch.ones_like(lin.weight)
    opt.step()
    w = StageWeights(dict(lin.named_parameters()), opt, "predict", stage=0, stages=2, variant="v1")
    x = torch.randn(5, 3, requires_grad=True)
    weights, _, ctx, _ = w.make(ahead=1)
    with ctx:
        out = torch.func.functional_call(lin, weights, (x,))
    del weights
    out.sum().backward()  # stage 0: the backward reads the live weights, rows 2..3 of big
    torch.testing.assert_close(x.grad, torch.ones(5, 2) @ lin.weight.detach())


@pytest.mark.parametrize("mode,expect", [("stash", "old"), ("stale", "new")])
def test_stash_keeps_forward_weights_stale_does_not(mode, expect):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    old = lin.weight.detach().clone()
    w = StageWeights(dict(lin.named_parameters()), opt, mode, stage=0, stages=2)
    x = torch.randn(4, 3, requires_grad=True)
    weights, leaves, ctx, kept = w.make(ahead=1)
    out = torch.func.functional_call(lin, weights, (x,))
    with torch.no_grad():
        lin.weight.mul_(2.0)
    out.sum().backward()  # never an in-place error: the graph holds its own tensors
    used = old if expect == "old" else lin.weight.detach()
    torch.testing.assert_close(x.grad, torch.ones(4, 2) @ used)


def test_a_forward_with_no_update_before_its_backward_runs_on_the_live_weights():
    """ahead 0: nothing updates the stage before this micro-batch's backward, so every mode's weights are the
    live ones and the engine calls the module itself; v1's half-way term (stage >= 2) still predicts."""
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(torch.randn(4, 3)).sum().backward()
    opt.step()  # a momentum buffer: there is a direction to predict along
    params = dict(lin.named_parameters())
    for mode, variant, stage in [("stale", "v1", 0), ("stash", "v1", 0), ("predict", "v1", 1), ("predict", "v2", 3)]:
        w = StageWeights(params, opt, mode, stage=stage, stages=4, variant=variant)
        assert w.make(ahead=0) is None, (mode, variant)
        assert w.make(ahead=1) is not None, (mode, variant)
    w = StageWeights(params, opt, "predict", stage=2, stages=4, variant="v1")
    weights, _, _, _ = w.make(ahead=0)  # s = ⌊2/2⌋ = 1 update ahead: W - lr * v
    v = opt.state[lin.weight]["momentum_buffer"]
    torch.testing.assert_close(weights["weight"], lin.weight.detach() - 0.1 * v)


def test_predict_adam_direction_and_refusals():
    from tessel.pipeline.predict import direction

    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.1)
    assert direction(opt, p) is None
    p.grad = torch.full((3,), 2.0)
    opt.step()
    # after one step m̂ = g, v̂ = g², so the direction is sign(g) (+ the decoupled decay)
    torch.testing.assert_close(direction(opt, p), torch.full((3,), 1.0) + 0.1 * p.detach(), atol=1e-6, rtol=0)
    with pytest.raises(PlanError, match="cannot predict weights for Adagrad; valid: AdamW, Adam, SGD"):
        StageWeights({"p": p}, torch.optim.Adagrad([p]), "predict", 0, 2)
    with pytest.raises(PlanError, match="without momentum"):
        StageWeights({"p": p}, torch.optim.SGD([p], lr=0.1), "predict", 0, 2)


OPTIMIZERS = {  # each optimizer the optimizer-aware guess supports, with the settings its formula reads
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
    "sgd-nesterov-decay": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                     foreach=False),
    "sgd-dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8, dampening=0.3, foreach=False),
    "adam-l2": lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, foreach=False),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True, foreach=False),
}


def _stepped(name: str):
    """A float64 parameter and its optimizer after three real updates (state, step count and moments in place)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    opt = OPTIMIZERS[name]([p])
    for _ in range(3):
        p.grad = torch.randn_like(p)
        opt.step()
    return p, opt


def _one_update(name: str, p: torch.Tensor, state: dict, lr: float) -> torch.Tensor:
    """The optimizer's next update of ``p`` with a zero gradient, written out from torch's documented algorithms."""
    w = p.detach()
    if name.startswith("sgd"):
        mu, damp, wd, nesterov = {"sgd": (0.9, 0, 0, False), "sgd-nesterov-decay": (0.9, 0, 0.01, True),
                                  "sgd-dampening": (0.8, 0.3, 0, False)}[name]
        g = wd * w
        buf = mu * state["momentum_buffer"] + (1 - damp) * g
        return w - lr * ((g + mu * buf) if nesterov else buf)
    b1, b2 = (0.9, 0.95) if name != "adamw-amsgrad" else (0.9, 0.999)
    t = float(state["step"]) + 1
    g = 0.1 * w if name == "adam-l2" else torch.zeros_like(w)
    w = w * (1 - lr * 0.1) if name.startswith("adamw") else w
    m, v = b1 * state["exp_avg"] + (1 - b1) * g, b2 * state["exp_avg_sq"] + (1 - b2) * g * g
    if name == "adamw-amsgrad":
        v = torch.maximum(state["max_exp_avg_sq"], v)
    return w - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + 1e-8)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_guess_is_the_optimizer_s_own_next_updates_with_no_new_gradient(name):
    """opt (XPipe / PipeOptim): one update ahead equals the formula written here; three ahead, at three different
    LRs, equal torch's own optimizer stepping a copy three times on zero gradients."""
    import copy

    from tessel.pipeline.predict import rolled

    p, opt = _stepped(name)
    torch.testing.assert_close(rolled(opt, p, [0.05]), _one_update(name, p, opt.state[p], 0.05), rtol=0, atol=1e-14)
    lrs = [0.05, 0.02, 0.01]
    twin = copy.deepcopy(opt)  # deep-copies the parameter with it
    q = twin.param_groups[0]["params"][0]
    for lr in lrs:
        for g in twin.param_groups:
            g["lr"] = lr
        q.grad = torch.zeros_like(q)
        twin.step()
    guess = rolled(opt, p, lrs)
    torch.testing.assert_close(guess, q.detach(), rtol=0, atol=1e-14)
    assert float((guess - p.detach()).abs().max()) > 1e-4  # the guess moves: the state carries a direction
    assert not torch.equal(p.detach(), q.detach())  # and the live weight was not touched by it


def test_opt_variant_forward_predicts_backward_reads_the_live_weights():
    """opt's forward runs on the optimizer's own guess of the weights s updates ahead; its backward multiplies by
    the weights live at backward time (rebuilt, no copy kept), as PipeOptim does; the gradient reaches the leaf."""
    from tessel.pipeline.predict import rolled

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin.weight.grad = torch.ones_like(lin.weight)
    opt.step()  # momentum buffer = ones
    w = StageWeights(dict(lin.named_parameters()), opt, "predict", stage=0, stages=4, variant="opt",
                     lr_of=lambda u: 0.1 / (u + 1))
    w.updates = 1
    x = torch.randn(5, 3, requires_grad=True)
    weights, leaves, ctx, kept = w.make(ahead=3)
    want = lin.weight.detach() - (0.05 * 0.9 + 0.1 / 3 * 0.81 + 0.025 * 0.729) * torch.ones(2, 3)
    torch.testing.assert_close(weights["weight"], want, rtol=0, atol=1e-7)
    torch.testing.assert_close(weights["weight"], rolled(opt, lin.weight, [0.05, 0.1 / 3, 0.025]))
    with ctx:
        out = torch.func.functional_call(lin, weights, (x,))
    assert kept is None
    del weights
    with torch.no_grad():
        lin.weight.add_(1.0)  # an update lands between forward and backward
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(5, 2) @ lin.weight.detach())
    torch.testing.assert_close(leaves["weight"].grad, torch.ones(5, 2).t() @ x.detach())
