"""Asynchronous pipelines' bookkeeping, observed at runtime: the LR each stage applies to each mini-batch's
update, and how far (s) and with which LRs each forward and backward predicts the weights.

3 stages, one micro-batch per step (SpecTrain's setting), a warm-up schedule so every step's LR differs:
stage k updates mini-batch j during step j + (2 - k) and must use mini-batch j's LR, not that step's; a forward
predicting s updates ahead must use the LRs of exactly those updates. Expected values are written here from
the schedule's definition, not taken from the code under test.
"""

import math

import torch

from composed import planned
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.train.build import build, build_data

LR, WARMUP, STEPS, STAGES = 0.05, 4, 6, 3
B1, WD = 0.99, 0.01  # the Nesterov method's NAdamW (its authors' beta1), with decoupled decay to see it applied
OPTIMIZERS = {"sgd": ["train.optimizer=sgd", "train.momentum=0.9"],
              "nadamw": ["train.optimizer=nadamw", f"train.beta1={B1}", f"train.weight_decay={WD}"]}


def lr_of(j: int) -> float:
    """Mini-batch j's LR: linear warm-up over WARMUP steps, then constant."""
    return LR * min(1.0, (j + 1) / WARMUP)


class Recorder:
    """Stands in for the engine's step tail: records the LR of every update, then runs it."""

    def __init__(self, tail):
        self.tail, self.lrs = tail, []

    def __call__(self, lr, *args, **kwargs):
        self.lrs.append(lr)
        return self.tail(lr, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tail, name)


def _engine(schedule: str, variant: str, micro: int, stages: int = STAGES, precision: str = "fp32", delay: int = 0,
            opt: str = "sgd"):
    """The pipeline engine of this rank's stage of an MLP with one Linear per stage (``stages - 1`` hidden layers
    and the head), SGD with momentum (or ``opt``) under a warm-up schedule, fp64 (bf16-mixed: fp32 masters); and
    the loader of its batches."""
    dtype = "float32" if precision == "bf16-mixed" else "float64"
    cfg = load_config(None, ["model.name=classifier", "model.in_features=12", "model.hidden=16",
                             f"model.layers={stages - 1}", "model.classes=3", f"train.dtype={dtype}",
                             f"train.precision={precision}",
                             "train.global_batch=4", f"train.micro_batches={micro}", *OPTIMIZERS[opt],
                             f"train.lr={LR}", f"train.warmup={WARMUP}",
                             "train.schedule=constant", "train.clip=0", f"train.steps={STEPS}", f"parallel.pp={stages}",
                             f"pipeline.schedule={schedule}", f"pipeline.predict={variant}",
                             f"pipeline.delay_lr={delay}",
                             "pipeline.split=" + ",".join(["1"] * stages)])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    model = build(cfg, 0).to(settings.torch_dtype)
    x, y = ShardedLoader(data, 4, 0, 1).next_batch()
    built = parallelize(model, plan, mesh, [(x.to(settings.torch_dtype), y)], settings)
    return built, ShardedLoader(data, 4, 0, 1)


def run(schedule: str, variant: str = "v1", micro: int = 1, delay: int = 0):
    built, loader = _engine(schedule, variant, micro, delay=delay)
    engine = built.engine
    engine.tail = Recorder(engine.tail)
    engine.weights.log = []
    for step in range(STEPS):
        x, y = loader.next_batch()
        engine.step(x.double(), y, step)
    engine.drain(STEPS)
    copies = engine.peak_kept_bytes / engine.stage_bytes
    return engine.stage.index, engine.tail.lrs, engine.weights.log, copies


def check(schedule, variant, m=1, delay=0):
    k, lrs, log, _ = run(schedule, variant, m, delay)
    lag = STAGES - k - 1
    tau = 1 + math.ceil(lag / m)  # PipeMare: the stage's LR starts at lr / tau and reaches lr at step ``delay``
    own = (lambda j: lr_of(j) * tau ** -max(0.0, 1 - j / delay)) if delay else lr_of
    # every stage updates mini-batches 0..STEPS-1 in order (the drain applies the last ones), each at its own LR
    assert lrs == [own(j) for j in range(STEPS)], (k, lrs)
    if schedule != "async-predict":
        return k
    extra = (k // 2) // m if variant == "v1" else 0  # SpecTrain v1's ⌊k/2⌋ half-way term, in updates
    # before micro-batch i's forward this stage has run the backwards of micro-batches 0 .. i-lag-1, so
    # updated (i-lag) // m mini-batches, and its own update (of mini-batch i // m) is the rest away: the
    # forward predicts across those and v1's extra ones, at their own LRs (a forward with nothing to predict
    # runs on the live weights, in both variants)
    done = [max(0, i - lag) // m for i in range(STEPS * m)]
    want = [(d, i // m - d + extra) for i, d in enumerate(done)]
    want = [w for w in want if w[1] > 0]
    forwards = [e[1:] for e in log if e[0] == "F"]
    assert [f[:2] for f in forwards] == want, (k, forwards)
    for done, n, shift in forwards:
        assert abs(shift - sum(own(done + t) for t in range(n))) < 1e-15, (k, done, n, shift)
    backwards = {e[1]: e[2:] for e in log if e[0] == "B"}  # per micro-batch (rebuilt once per weight)
    if variant != "v1" or extra == 0:
        assert not backwards, backwards  # v2 reuses the forward's weights; opt and v1 without its extra: the live ones
    else:  # v1 rebuilds at backward time, extra updates ahead of those done by then (lag 0: i // m of them)
        assert sorted(backwards) == list(range(STEPS)), (k, backwards)
        for done, (n, shift) in backwards.items():
            assert n == extra and abs(shift - sum(own(done + t) for t in range(n))) < 1e-15, (k, done, n)
    return k


def test_async_updates_use_their_mini_batch_lr_and_predictions_their_updates_lrs(world3):
    for schedule, variant, m in [("async-predict", "v1", 1), ("async-predict", "v2", 1), ("async", "v1", 1),
                                 ("async-predict", "v1", 2), ("async-predict", "v2", 2), ("async-predict", "opt", 1),
                                 ("async-predict", "opt", 2)]:
        assert world3.run(check, schedule, variant, m) == [0, 1, 2]
    for schedule, variant, m in [("async-predict", "v1", 1), ("async", "v1", 1), ("async-predict", "opt", 2)]:
        assert world3.run(check, schedule, variant, m, 4) == [0, 1, 2]  # PipeMare's rescheduling over 4 steps


def check_v2_copies():
    k, _, _, copies = run("async-predict", "v2")
    return copies


def test_v2_weight_copies_are_counted_per_micro_batch(world3):
    """v2 keeps one predicted copy per micro-batch in flight: stage k holds lag + 1 of them at most (the micro-
    batches between a forward and its backward), counted by a counter (the ids of freed dicts, reused, were
    undercounting them). The last stage (lag 0) predicts nothing: its forwards run on the live weights."""
    assert world3.run(check_v2_copies) == [3.0, 2.0, 0.0]


def test_v2_shares_one_copy_per_weight_version_and_names_it_by_the_version():
    """v2's graphs keep their forward's Ŵ. The forwards of one weight version and s share one copy (one key, one
    storage), a new version makes a new copy under a new key, and no key rests on an id Python reuses for a
    freed dict."""
    from tessel.pipeline.predict import StageWeights

    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    w = StageWeights(dict(lin.named_parameters()), opt, "predict", stage=0, stages=2, variant="v2")
    keys, storages = [], []
    for _ in range(3):
        for _ in range(2):
            weights, leaves, _, kept = w.make(ahead=1)
            keys.append(kept)
            storages.append(weights["weight"].untyped_storage().data_ptr())
            buf = opt.state[lin.weight].get("momentum_buffer")
            want = lin.weight.detach() if buf is None else lin.weight.detach() - 0.1 * buf
            torch.testing.assert_close(weights["weight"], want)  # Ŵ = W − η·v (SGD: v is the momentum buffer)
            del weights, leaves  # the engine drops the dict after the forward: its id is free for the next one
        lin(torch.randn(4, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
        w.updates += 1
    assert keys[0::2] == keys[1::2] and storages[0::2] == storages[1::2], keys
    assert len(set(keys)) == 3 and w.made == 3, keys


def test_prediction_error_example_measures_the_guess_against_the_weights_reached(tmp_path, monkeypatch, capsys):
    """examples/prediction_error.py (docs/pipeline.md's "How close the guess comes") on a short run: SpecTrain's
    guess lands closer to the weights s updates later than the stale weights do (share left < 1), and more so
    for fewer updates ahead."""
    import trained

    monkeypatch.chdir(tmp_path)  # in this process, as the script runs it
    trained.script_main(trained.example("prediction_error", monkeypatch),
                        ["--tasks", "classifier", "--steps", "60", "--every", "5"], monkeypatch)
    printed = capsys.readouterr().out
    rows = [line.split("|") for line in printed.splitlines() if line.startswith("| classifier |")]
    assert [(row[2].split("(")[1].rstrip(") "), row[3].strip()) for row in rows] == [
        (phase, guess) for phase in ("early", "middle", "late", "all") for guess in ("linear", "decayed", "opt")]
    weights = [float(v) for v in rows[-3][4].split("/")]  # all steps, the linear guess: s = 1, 2, 3
    assert 0 < weights[0] < weights[1] < weights[2] < 1, printed
    assert rows[-2][4] == rows[-1][4], printed  # SGD without decay: its own next updates are the decayed guess


# -- the asynchronous math, exactly: the pipeline against a one-process emulation --------------------------

def _seen(schedule: str, variant: str, stages: int, m: int):
    """(forward, backward) weights of stage k for micro-batch i, from ``at(k, updates done, updates to predict)``:
    the forward meets the weights after d = max(0, i - lag) // m updates (lag = stages - k - 1), the backward
    those after i // m, and v1 predicts ⌊k/2⌋ // m updates further both times; opt predicts the forward's with the
    momentum decaying (no gradient to come) and its backward multiplies by the live weights."""
    def rule(k: int, i: int, at):
        d, live = max(0, i - (stages - k - 1)) // m, i // m
        extra = (k // 2) // m if variant == "v1" else 0
        if schedule == "async":  # the classic inconsistency: the backward multiplies by the live weights
            return at(k, d, 0), at(k, live, 0)
        if schedule == "async-stash":  # PipeDream: the forward's weights both ways
            return at(k, d, 0), at(k, d, 0)
        if variant == "opt":  # XPipe / PipeOptim: the optimizer's own next updates, for the forward only
            return at(k, d, live - d, decay=True), at(k, live, 0)
        forward = at(k, d, live - d + extra)  # SpecTrain's Ŵ across the updates before its own, and v1's extra
        return forward, (forward if variant == "v2" else at(k, live, extra))
    return rule


def _nadamw(w: torch.Tensor, b: torch.Tensor):
    """torch's NAdam with AdamW's decoupled decay on copies of one stage's (weight, bias): each call applies one
    update with the given gradients at the given LR and returns the weights after it."""
    params = [w.clone().requires_grad_(), b.clone().requires_grad_()]
    opt = torch.optim.NAdam(params, lr=LR, betas=(B1, 0.999), weight_decay=WD, decoupled_weight_decay=True,
                            foreach=False)

    def update(grads, lr):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.param_groups[0]["lr"] = lr
        opt.step()
        return tuple(p.detach().clone() for p in params)
    return update


def emulate(schedule: str, variant: str, m: int, weights, batches, bf16: bool = False, delay: int = 0,
            opt: str = "sgd"):
    """One process replaying what an asynchronous 1F1B computes on an MLP with one Linear per stage (ReLU after
    all but the last), micro-batch by micro-batch, with the weights ``_seen`` names: the gradient of a weight
    uses the forward's activations, the gradient sent back multiplies by the backward's weights, and update j
    (after mini-batch j's last micro-batch) is SGD with momentum 0.9 at lr_of(j). Ŵ = W(d) - (lr(d) + ... +
    lr(d + s - 1)) * buf(d), buf the momentum buffer after update d; for opt the t-th term times 0.9^(t+1).
    ``delay`` > 0: PipeMare's rescheduling, stage k's update j at lr_of(j) * tau_k^-(1 - min(j / delay, 1)), tau_k
    = 1 + ceil((stages - k - 1) / m), in its updates and its predictions. Returns each micro-batch's loss and the
    final weights per stage. ``bf16``: every product under autocast (bf16 inputs and outputs, so activations and
    their gradients cross stages rounded), the softmax, gradients and updates in fp32, as bf16-mixed does.
    ``opt="nadamw"``: each stage's update is torch's NAdam (decoupled decay) instead; it has no momentum buffer
    here, so only the schedules that predict nothing (async, async-stash) take it."""
    stages = len(weights)
    assert opt == "sgd" or schedule in ("async", "async-stash"), "a prediction here extrapolates SGD's buffer only"
    nadamw = [_nadamw(w, b) for w, b in weights] if opt == "nadamw" else None
    hist = [[(w.clone(), b.clone())] for w, b in weights]  # per stage, its weights after 0, 1, 2, ... updates
    bufs = [[None] for _ in weights]  # per stage, its momentum buffer after each update (none before the first)

    def lr(k, j):
        tau = 1 + math.ceil((stages - k - 1) / m)
        return lr_of(j) * (tau ** -max(0.0, 1 - j / delay) if delay else 1.0)

    def at(k, done, ahead, decay=False):
        (w, b), buf = hist[k][done], bufs[k][done]
        # SGD's next updates with no new gradient: buf shrinks by 0.9 before each (opt); SpecTrain keeps it (linear)
        shift = sum(lr(k, done + t) * (0.9 ** (t + 1) if decay else 1) for t in range(ahead))
        return (w, b) if buf is None else (w - shift * buf[0], b - shift * buf[1])

    seen, losses, grads = _seen(schedule, variant, stages, m), [], [None] * stages
    mixed = torch.autocast("cpu", torch.bfloat16, enabled=bf16)
    for i, (x, y) in enumerate(batches):
        fwd, bwd = zip(*(seen(k, i, at) for k in range(stages)))
        acts, zs = [x], []
        for k, (w, b) in enumerate(fwd):
            with mixed:
                zs.append(torch.nn.functional.linear(acts[-1], w, b))
            acts.append(zs[-1].clamp_min(0) if k < stages - 1 else zs[-1])
        logp = acts[-1].to(x.dtype).log_softmax(-1)
        losses.append(float(-logp[torch.arange(len(y)), y].mean()) / m)
        dz = (logp.exp() - torch.nn.functional.one_hot(y, logp.size(-1))) / len(y) / m  # d loss / d logits
        dz = dz.to(torch.bfloat16) if bf16 else dz  # the logits were bf16: their gradient is too
        for k in reversed(range(stages)):
            with mixed:
                g = ((dz.T @ acts[k]).to(x.dtype), dz.sum(0).to(x.dtype))
            grads[k] = g if grads[k] is None else (grads[k][0] + g[0], grads[k][1] + g[1])
            if k:
                with mixed:
                    dz = (dz @ bwd[k][0]) * (zs[k - 1] > 0)
        if (i + 1) % m == 0:  # the mini-batch's last backward: every stage applies update i // m
            for k in range(stages):
                if nadamw:
                    hist[k].append(nadamw[k](grads[k], lr(k, i // m)))
                    bufs[k].append(None)  # no SGD buffer: at() then reads the weights as they are
                    continue
                buf = grads[k] if bufs[k][-1] is None else tuple(0.9 * o + g for o, g in zip(bufs[k][-1], grads[k]))
                w, b = hist[k][-1]
                hist[k].append((w - lr(k, i // m) * buf[0], b - lr(k, i // m) * buf[1]))
                bufs[k].append(buf)
            grads = [None] * stages
    return losses, [h[-1] for h in hist]


def run_to_the_end(schedule: str, variant: str, m: int, stages: int, precision: str = "fp32", delay: int = 0,
                   opt: str = "sgd"):
    """This rank's stage after STEPS steps and the drain: (stage, losses per step, weight, bias, printed plan)."""
    built, loader = _engine(schedule, variant, m, stages, precision, delay, opt)
    losses, dtype = [], torch.float32 if precision == "bf16-mixed" else torch.float64
    for step in range(STEPS):
        x, y = loader.next_batch()
        losses.append(built.engine.step(x.to(dtype), y, step).loss)
    built.engine.drain(STEPS)
    w, b = (p.detach().clone() for p in built.engine.params.values())  # the stage's one Linear
    return built.engine.stage.index, losses, w, b, built.describe()


CASES = [(3, "async", "v1", 1), (3, "async-stash", "v1", 1), (3, "async-predict", "v1", 1),
         (3, "async-predict", "v2", 1), (3, "async", "v1", 2), (3, "async-stash", "v1", 2),
         (3, "async-predict", "v1", 2), (3, "async-predict", "v2", 2),
         # stage 2 of 4 is the one where v1's backward predicts (⌊2/2⌋ = 1) across updates that came after its
         # forward (lag 1): the rebuilt weights differ from the forward's only there
         (4, "async-predict", "v1", 1),
         # the optimizer's own guess (forward only, live backward) at 3 and 4 stages, 1 and 2 micro-batches
         (3, "async-predict", "opt", 1), (3, "async-predict", "opt", 2), (4, "async-predict", "opt", 1),
         (4, "async-predict", "opt", 2),
         # PipeMare's LR rescheduling over 4 of the 6 steps, with stale weights and with each guess
         (3, "async", "v1", 1, 4), (3, "async-predict", "v1", 2, 4), (4, "async-predict", "opt", 1, 4),
         (4, "async-predict", "v2", 2, 4),
         # the Nesterov method as its authors run it: PipeDream's stashed weights, NAdamW with beta1 0.99
         (3, "async-stash", "v1", 1, 0, "nadamw"), (3, "async-stash", "v1", 2, 0, "nadamw"),
         (4, "async-stash", "v1", 1, 0, "nadamw"), (4, "async-stash", "v1", 2, 0, "nadamw")]


def run_cases(cases):
    return [(case, run_to_the_end(case[1], case[2], case[3], case[0], "fp32", *case[4:])) for case in cases]


def _expected(stages: int, schedule: str, variant: str, m: int, delay: int = 0, opt: str = "sgd",
              dtype=torch.float64, bf16: bool = False):
    cfg = load_config(None, ["model.name=classifier", "model.in_features=12", "model.hidden=16",
                             f"model.layers={stages - 1}", "model.classes=3", "train.global_batch=4"])
    torch.manual_seed(1)
    net = build(cfg, 0).to(dtype).net
    start = [(net[j].weight.detach(), net[j].bias.detach()) for j in range(0, 2 * stages, 2)]
    loader = ShardedLoader(build_data(cfg), 4, 0, 1)
    micro = [(x.to(dtype)[r], y[r]) for x, y in (loader.next_batch() for _ in range(STEPS))
             for r in torch.arange(4).chunk(m)]
    return start, *emulate(schedule, variant, m, start, micro, bf16, delay, opt)


def test_async_pipelines_equal_a_one_process_emulation_of_their_staleness(world3, world4):
    """Each asynchronous schedule computes exactly (fp64, 1e-10) what ``emulate`` says, at one micro-batch per step
    and at two: every loss the last stage logs, and every stage's weights after the drain. An asynchronous run's
    math is fixed by the schedule, the cut and the data, not by timing."""
    got = {}
    for world, stages in ((world3, 3), (world4, 4)):
        for rank in world.run(run_cases, [c for c in CASES if c[0] == stages]):
            for case, result in rank:
                got.setdefault(case, []).append(result)
    finals = []
    for case, ranks in got.items():
        start, want_losses, want = _expected(*case)
        stages, m = case[0], case[3]
        for k, losses, w, b, printed in ranks:
            torch.testing.assert_close(w, want[k][0], rtol=0, atol=1e-10, msg=f"{case} stage {k}")
            torch.testing.assert_close(b, want[k][1], rtol=0, atol=1e-10, msg=f"{case} stage {k}")
            assert "--pipeline.split" not in printed  # a cut the user gave needs no hint to be repeated
            if k == stages - 1:  # the last stage logs its step's micro-batches' losses (each scaled by 1/m)
                per_step = [sum(want_losses[s * m:(s + 1) * m]) for s in range(STEPS)]
                assert len(losses) == STEPS and max(abs(a - e) for a, e in zip(losses, per_step)) < 1e-10, case
        assert max(float((w - w0).abs().max()) for (w, _), (w0, _) in zip(want, start)) > 1e-3, case  # it trained
        finals.append(torch.cat([w.flatten() for w, _ in want]))
    # every case ends somewhere else: the test tells each schedule's math from the others'
    assert min(float((a - b).abs().max()) for i, a in enumerate(finals) for b in finals[:i]
               if a.numel() == b.numel()) > 1e-6


BF16_CASES = [(3, "async", "v1", 1), (3, "async-predict", "v1", 1), (3, "async-predict", "v2", 2)]


def run_bf16(cases):
    return [(case, run_to_the_end(*case[1:], case[0], "bf16-mixed")) for case in cases]


def test_async_predict_in_bf16_mixed_equals_the_emulation_in_bf16_within_bf16s_rounding(world3):
    """SpecTrain under bf16-mixed against ``emulate`` with the same products in bf16: each loss and each stage's
    fp32 weights after the drain within 3x the emulation's own bf16-against-fp32 distance (the reasoning of
    tests/test_precision.py: the pipeline and the emulation round in different places, each at most as much as
    bf16 does; prediction scales what it extrapolates, rounding included, by the updates it looks ahead, which
    the emulation does too)."""
    for case, ranks in zip(BF16_CASES, zip(*world3.run(run_bf16, BF16_CASES))):
        _, bf16_losses, bf16 = _expected(*case, dtype=torch.float32, bf16=True)
        _, fp32_losses, fp32 = _expected(*case, dtype=torch.float32)
        m = case[3]
        per_step = lambda ls, m=m: [sum(ls[s * m:(s + 1) * m]) for s in range(STEPS)]  # noqa: E731
        loss_gap = max(abs(a - b) for a, b in zip(per_step(bf16_losses), per_step(fp32_losses)))
        for (_, result) in ranks:
            k, losses, w, b, _ = result
            for got, want, other in ((w, bf16[k][0], fp32[k][0]), (b, bf16[k][1], fp32[k][1])):
                assert float((got - want).abs().max()) <= 3 * float((want - other).abs().max()), (case, k)
            if k == case[0] - 1:
                gap = max(abs(a - e) for a, e in zip(losses, per_step(bf16_losses)))
                assert gap <= 3 * loss_gap, (case, gap, loss_gap)
