"""tessel.prepare with a ParallelPlan: a registered model under pp and tp through ``model.step``, equal to its
single-process loop to 1e-10 in fp64.

Per case: the model and loop written here (a model registered in this file for pp; tessel's registered
classifier and Transformer LM for tp), an LR schedule and clipping that bites, 5 steps; trained once without
tessel on the whole global batch and once prepared on this world's ranks; every parameter compared on the
rank holding it, and the loss every rank gets back. Plus resume, and the one-line errors.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

import tessel
from tessel import Chain, Layer, ParallelPlan, TableChoice, TesselError, comm
from tessel.models import LSTMLM, DenseClassifier, TransformerLM
from tessel.prepare_axes import checkpoint_plan

STEPS, BATCH, CLIP = 5, 8, 0.05
MID = 2  # the step after which a loop evaluates


class Tower(nn.Module):
    """A user's model: a table, then three linears; tessel has never seen it."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(40, 8)
        self.l1, self.l2, self.out = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 5)

    def forward(self, x, y):  # x (B, 4) ids, y (B,)
        h = torch.tanh(self.l2(torch.tanh(self.l1(self.words(x).mean(1)))))
        return F.cross_entropy(self.out(h), y)


tessel.register_model(Tower, chain=lambda m: Chain([
    Layer("words", ("words",), lambda r, x: r.words(x).mean(1)),  # (B, 4) ids -> (B, 8)
    Layer("l1", ("l1",), lambda r, h: torch.tanh(r.l1(h))),
    Layer("l2", ("l2",), lambda r, h: torch.tanh(r.l2(h))),
    Layer("out", ("out",), lambda r, h: r.out(h)),
], F.cross_entropy))

MODELS = {  # name -> (model, one global batch from a generator)
    "tower": (Tower, lambda g: (torch.randint(0, 40, (BATCH, 4), generator=g),
                                torch.randint(0, 5, (BATCH,), generator=g))),
    "classifier": (lambda: DenseClassifier(in_features=8, hidden=16, layers=2, classes=4),
                   lambda g: (torch.randn(BATCH, 8, generator=g, dtype=torch.float64),
                              torch.randint(0, 4, (BATCH,), generator=g))),
    # a sampled softmax: trained on drawn candidates, evaluated by the full softmax over its whole table
    "lstm": (lambda: LSTMLM(vocab_size=60, dim=8, hidden=16, softmax="sampled", num_sampled=6),
             lambda g: (torch.randint(0, 60, (BATCH, 4), generator=g), torch.randint(0, 60, (BATCH, 4), generator=g))),
    "lm": (lambda: TransformerLM(vocab_size=32, seq_len=4, dim=8, layers=2, heads=2),
           lambda g: (torch.randint(0, 32, (BATCH, 4), generator=g), torch.randint(0, 32, (BATCH, 4), generator=g))),
}
OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
              "plain-sgd": lambda p: torch.optim.SGD(p, lr=0.5),  # exact on served rows, as Adagrad
              "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.3),
              "adam": lambda p: torch.optim.Adam(p, lr=0.02),
              "adam-fused": lambda p: torch.optim.Adam(p, lr=0.02, fused=True),
              "sgd-fused": lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9, fused=True)}


def _setup(name, opt_name):
    torch.manual_seed(3)
    model = MODELS[name][0]().double()
    opt = OPTIMIZERS[opt_name](model.parameters())
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))


def _batches(name, n=STEPS):
    g = torch.Generator().manual_seed(7)
    return [MODELS[name][1](g) for _ in range(n)]


def _held_out(name):
    """A global batch no step trains on."""
    return MODELS[name][1](torch.Generator().manual_seed(11))


def _reference(name, opt_name):
    """The single-process loop: parameters after STEPS steps, the losses, and the held-out batch's loss after."""
    model, opt, sched = _setup(name, opt_name)
    losses, held = [], []
    for i, (x, y) in enumerate(_batches(name)):
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.detach())
        if i + 1 in (MID, STEPS):
            model.eval()
            with torch.no_grad():
                held.append(model(*_held_out(name)))
            model.train()
    return dict(model.named_parameters()), torch.stack(losses), torch.stack(held)


def _evaluated(model, loader, name):
    """model.evaluate on this rank's slice of the held-out batch (sliced as the training batches are)."""
    (x, y), = loader.sliced([_held_out(name)])
    return model.evaluate(x, y)


def _stepped(name, opt_name, plan, held=None, **kw):
    """The prepared loop; with a list ``held``, the held-out loss after step MID appended to it (an evaluation
    between steps: scheduled tables have the next batch's rows on their way)."""
    model, opt, sched = _setup(name, opt_name)
    model, opt, loader = tessel.prepare(model, opt, _batches(name), plan=plan, max_norm=CLIP, verbose=False, **kw)
    losses = []
    for x, y in loader:
        losses.append(model.step(x, y))
        sched.step()  # on the user's optimizer, made before prepare
        if held is not None and len(losses) == MID:
            held.append(_evaluated(model, loader, name))
    return model, opt, loader, torch.stack(losses)


def _held(model) -> dict[str, torch.Tensor]:
    """name -> the tensor this rank holds (a tp shard: its block; an FSDP shard: its rows, as a plain tensor,
    since comparing DTensors is a collective and each stage holds other weights); served tables gathered whole."""
    out = {n.removeprefix("root."): (p.to_local() if isinstance(p, DTensor) else p).detach()
           for n, p in model.module.named_parameters()}
    if model.tables:
        out.update({k: v for k, v in model.tables.state_dict().items() if not k.startswith("state.")})
    return out


def check_parity(cases):
    for name, opt_name, plan in cases:
        want, ref_losses, ref_held = _reference(name, opt_name)
        held = []
        model, _, loader, losses = _stepped(name, opt_name, plan, held)
        assert torch.allclose(losses, ref_losses, atol=1e-10, rtol=0), (name, plan, losses, ref_losses)
        cut = plan.bounds == ((0, 2), (2, 4)) and plan.dp == 1  # the cut after l1: (B/m, 16) fp64 per micro-batch
        m = plan.micro_batches
        block = (BATCH // m) * 16 * 8
        if cut:  # forward activations one way, their gradients back: each stage sends one block per micro-batch;
            # the evaluation after step MID: the first stage's activations only
            sent = STEPS * m * block + (m * block if model.par.engine.stage.first else 0)
            assert comm.counter.total()["pp"]["sent"] == sent, comm.counter.total()
        comm.counter.reset()
        # an evaluation forward: the held-out loss of the trained weights on every rank, and nothing updated (the
        # weights are compared after it and after the one mid-loop); on the cut after l1 only the first stage
        # sends, an activation a micro-batch, and no gradient comes back
        held.append(_evaluated(model, loader, name))
        assert torch.allclose(torch.stack(held), ref_held, atol=1e-10, rtol=0), (name, plan, held, ref_held)
        if cut:
            sent = m * block if model.par.engine.stage.first else 0
            assert comm.counter.total().get("pp", {"sent": 0})["sent"] == sent, comm.counter.total()
        got, params = _held(model), dict(model.module.named_parameters())
        assert got, (name, plan)
        for n, t in got.items():
            w = want[n].detach()
            split = getattr(params.get(n, params.get("root." + n)), "tp_split", None)
            if split is not None:  # a tensor-parallel shard: the same block of the single-process tensor
                w = model.par.shards.grid.local(w, split)
            assert torch.allclose(t, w, atol=1e-10, rtol=0), (name, opt_name, plan.describe(), n)
        served = {t.strategy for t in model.par.plan.tables}
        if plan.tables:
            assert served == {t.strategy for t in plan.tables}, model.par.plan.tables
        assert loader.state_dict() == {"position": 0, "steps": STEPS}
        comm.counter.reset()
    return dist.get_rank()


PP = ParallelPlan(dp=1, pp=2, micro_batches=2)
TP = ParallelPlan(dp=1, tp=2, tp_grid=(2,))


def test_pp2_and_tp2_through_model_step_equal_single_process(world2):
    cases = [("tower", "sgd", PP.with_(bounds=((0, 2), (2, 4)))),
             ("tower", "adam", PP.with_(schedule="gpipe", micro_batches=4)),
             ("classifier", "sgd", TP), ("lm", "adam", TP)]
    assert world2.run(check_parity, cases) == [0, 1]


def test_tables_served_inside_pipeline_stages_and_pp_x_tp_at_4_ranks(world4):
    ps = (TableChoice("words", "ps"),)
    cases = [("tower", "adagrad", ParallelPlan(dp=2, pp=2, micro_batches=2, tables=ps)),
             ("tower", "plain-sgd", ParallelPlan(dp=2, pp=2, micro_batches=2,
                                                 tables=(TableChoice("words", "alltoall", "column"),))),
             ("lm", "sgd", ParallelPlan(dp=1, pp=2, tp=2, tp_grid=(2,), micro_batches=2)),
             ("lstm", "plain-sgd", ParallelPlan(dp=2, pp=2, micro_batches=2, tables=tuple(
                 TableChoice(n, "ps") for n in ("embedding", "head.weight", "head.bias"))))]
    assert world4.run(check_parity, cases) == [0, 1, 2, 3]


def check_sharded(cases):
    """Parity of sharded stages and blocks through model.step, the trained weights from tessel.unwrap (every rank
    holds a shard of each: unwrap gathers them whole)."""
    for name, opt_name, plan in cases:
        want, ref_losses, ref_held = _reference(name, opt_name)
        held = []
        model, _, loader, losses = _stepped(name, opt_name, plan, held)
        assert torch.allclose(losses, ref_losses, atol=1e-10, rtol=0), (name, plan.describe(), losses, ref_losses)
        # FSDP gathers each unit for the evaluation's forwards too
        held.append(_evaluated(model, loader, name))
        assert torch.allclose(torch.stack(held), ref_held, atol=1e-10, rtol=0), plan.describe()
        assert model.par.plan.dp_shard == plan.dp_shard
        got = dict(tessel.unwrap(model).named_parameters())
        assert got.keys() == want.keys()
        for n, t in got.items():
            assert torch.allclose(t, want[n].detach(), atol=1e-10, rtol=0), (name, plan.describe(), n)
    return dist.get_rank()


def test_sharded_stages_and_blocks_through_model_step_at_4_ranks(world4):
    """tessel.prepare shards a user's pipeline stages and tensor-parallel blocks (FSDP over dp_shard ranks), as
    tessel train does: ZeRO-3 memory in the user's own loop, equal to the single-process loop; fused optimizers
    (torch's fused SGD has no DTensor rule) step the shards one tensor at a time."""
    cases = [("tower", "adam", ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=2)),
             ("lm", "adam", ParallelPlan(dp=2, dp_shard=2, tp=2, tp_grid=(2,))),
             ("tower", "adam-fused", ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=2)),
             ("tower", "sgd-fused", ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=2))]
    assert world4.run(check_sharded, cases) == [0, 1, 2, 3]


def check_resume(tmp, plan):
    def train(stop=None, resume=None, plan=plan):
        model, opt, sched = _setup("tower", "sgd")
        model, opt, loader = tessel.prepare(model, opt, _batches("tower"), plan=plan, max_norm=CLIP,
                                            verbose=False, resume=resume)
        if resume:
            assert tessel.load(resume, model, opt, loader) == stop
            for _ in range(stop):
                sched.step()  # the scheduler's state is the caller's
        for x, y in loader:
            model.step(x, y)
            sched.step()
            if resume is None and loader.steps == stop:
                tessel.save(tmp, model, opt, loader)
                return None
        return _held(model)

    train(stop=3)
    # the uninterrupted run on the cut the saving run's profile chose (a cut from timings can differ run to run);
    # the resumed run is given the plan without one, and keeps the saved cut
    straight = train(plan=plan.with_(bounds=checkpoint_plan(tmp).bounds))
    resumed = train(stop=3, resume=tmp)
    assert straight and resumed.keys() == straight.keys()
    return all(torch.equal(resumed[n], straight[n]) for n in straight)


def test_pipelined_loop_resumes_bit_identical(world2, tmp_path):
    assert world2.run(check_resume, str(tmp_path), PP) == [True, True]


def test_sharded_pipelined_loop_resumes_bit_identical(world4, tmp_path):
    """Pipeline stages sharded over dp (FSDP2, dp_shard 2): tessel.save writes each stage's whole weights and
    optimizer state from the shards, tessel.load puts them back into fresh shards, and the resumed run ends
    bit-identical to the uninterrupted one."""
    assert world4.run(check_resume, str(tmp_path), ParallelPlan(dp=2, dp_shard=2, pp=2, micro_batches=2)) == [True] * 4


def check_errors():
    model, opt, _ = _setup("tower", "sgd")
    model, opt, loader = tessel.prepare(model, opt, _batches("tower"), plan=PP, verbose=False)
    x, y = next(iter(loader))
    cases = [
        (lambda: model(x, y), "loss = model.step(x, y)"),
        # a short batch: every rank refuses it, before any stage sends (BATCH rows, dp 1: the slice is the batch)
        (lambda: model.evaluate(x[:6], y[:6]), f"inputs of shape (6, 4); under a pipeline every batch has the "
                                                f"training slice's shape ({BATCH}, 4)"),
        (lambda: opt.step(), "drop optimizer.step()"),
        (lambda: tessel.prepare(*_setup("tower", "sgd")[:2], _batches("tower"), plan=ParallelPlan(dp=1, pp=4)),
         "the plan needs dp x pp x tp = 1 x 4 x 1 = 4 ranks and the script runs on 2"),
        (lambda: tessel.prepare(*_setup("tower", "sgd")[:2], _batches("tower"), plan=TP),
         "tp=2 needs a tensor-parallel plan registered for Tower"),
        (lambda: tessel.prepare(nn.Linear(4, 2), torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=1),
                                [(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long))], plan=PP),
         "cannot cut Linear into layers"),
        (lambda: tessel.prepare(*_setup("tower", "sgd")[:2], _batches("tower"), plan=PP.with_(schedule="torch-1f1b")),
         "names torch's own torch-1f1b"),
        (lambda: tessel.prepare(*_setup("tower", "sgd")[:2], _batches("tower"), plan=PP.with_(micro_batches=3)),
         "global batch 8 is not divisible"),
    ]
    lines = []
    for fn, text in cases:
        with pytest.raises(TesselError) as e:
            fn()
        assert text in str(e.value) and "\n" not in str(e.value), str(e.value)
        lines.append(str(e.value))
    return len(lines)


def test_pipelined_loop_errors_are_one_line_each(world2):
    assert world2.run(check_errors) == [8, 8]


def check_async(tmp):
    """An asynchronous schedule through model.step runs, and save first applies the updates still in flight."""
    model, opt, loader, losses = _stepped("tower", "sgd", PP.with_(schedule="async-predict"))
    engine = model.par.engine
    in_flight, before = engine.fed, [p.detach().clone() for p in model.parameters()]
    tessel.save(tmp, model, opt, loader)
    moved = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return in_flight, engine.fed, moved, bool(torch.isfinite(losses).all())


def check_async_evaluate():
    """model.evaluate under an asynchronous schedule applies the updates in flight first (as save does): its loss
    is the drained weights' (those tessel.unwrap gathers), and the next step fills the pipeline again."""
    model, _, loader, _ = _stepped("tower", "sgd", PP.with_(schedule="async-predict"))
    engine = model.par.engine
    in_flight = engine.fed
    held = _evaluated(model, loader, "tower")
    drained = engine.fed
    plain = tessel.unwrap(model)
    plain.eval()
    with torch.no_grad():
        want = plain(*_held_out("tower"))
    x, y = _batches("tower", 1)[0]
    loss = model.step(x, y)
    fed = engine.fed
    model.drain()  # nothing left in flight on the world's groups for the next test
    return in_flight, drained, float((held - want).abs()), bool(torch.isfinite(loss)), fed


def test_async_schedule_through_model_step_drains_on_save(world2, tmp_path):
    first, last = world2.run(check_async, str(tmp_path))
    assert first[:2] == last[:2] == (10, 0) and first[3] and last[3]  # 5 steps x 2 micro-batches fed, then none
    # the first stage still owes the last micro-batch's backward (the last stage owes none): its update lands
    assert first[2] and not last[2]
    for in_flight, drained, err, finite, fed in world2.run(check_async_evaluate):
        assert (in_flight, drained, fed) == (10, 0, 2) and err < 1e-10 and finite


def test_pipeline_example_runs(world2):
    """examples/prepare_pipeline.py on 2 ranks (pp=2), those of a test world (the launch by `tessel run` is
    test_prepare's)."""
    import re

    import trained

    printed = world2.run(trained.run_example, "prepare_pipeline")[0]
    first, last, held = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+), held-out ([\d.]+)", printed).groups())
    assert last < first - 0.2 and held < first - 0.2, printed
    # the first stage sends 4 micro-batches of (16, width) fp32 activations per step; the profile picks the cut
    # (sub-millisecond timings): after the word table the activation is 32 wide, after a hidden layer 128
    end = int(re.search(r"stages 0-(\d+) \|", printed).group(1))
    width = 32 if end == 0 else 128
    assert f"'pp': {4 * 16 * width * 4}" in printed, printed


def test_plan_of_one_process_or_data_parallel_only_takes_the_plain_path():
    model, opt, _ = _setup("tower", "sgd")
    with pytest.raises(TesselError, match="max_norm clips inside model.step under pp or tp"):
        tessel.prepare(model, opt, _batches("tower"), plan=ParallelPlan(dp=1), max_norm=1.0)
    model, opt, loader = tessel.prepare(model, opt, _batches("tower"), plan=ParallelPlan(dp=1))
    x, y = next(iter(loader))
    assert model(x, y).dim() == 0  # the data-parallel object: forward, backward and step as before
