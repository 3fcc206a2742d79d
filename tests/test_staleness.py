"""Asynchronous pipelines' bookkeeping, observed at runtime: the LR each stage applies to each mini-batch's
update, and how far (s) and with which LRs each forward and backward predicts the weights.

3 stages, one micro-batch per step (SpecTrain's setting), a warm-up schedule so every step's LR differs:
stage k updates mini-batch j during step j + (2 - k) and must use mini-batch j's LR, not that step's; a forward
predicting s updates ahead must use the LRs of exactly those updates. Expected values are written here from
the schedule's definition, not taken from the code under test.
"""

import torch
import torch.distributed as dist

from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.plan import ParallelPlan
from tessel.train.build import build, build_data

LR, WARMUP, STEPS, STAGES = 0.05, 4, 6, 3


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


def run(schedule: str, variant: str = "v1", micro: int = 1):
    cfg = load_config(None, ["model.name=classifier", "model.in_features=12", "model.hidden=16", "model.layers=2",
                             "model.classes=3", "train.dtype=float64", "train.global_batch=4",
                             f"train.micro_batches={micro}", "train.optimizer=sgd", "train.momentum=0.9",
                             f"train.lr={LR}", f"train.warmup={WARMUP}", "train.schedule=constant", "train.clip=0",
                             f"train.steps={STEPS}",
                             f"parallel.pp={STAGES}", f"pipeline.schedule={schedule}", f"pipeline.predict={variant}",
                             "pipeline.split=1,1,1"])
    plan = ParallelPlan.from_config(cfg, dist.get_world_size()).check(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    model = build(cfg, 0).double()
    loader = ShardedLoader(data, 4, 0, 1)
    x, y = ShardedLoader(data, 4, 0, 1).next_batch()
    engine = parallelize(model, plan, mesh, cfg, [(x.double(), y)]).engine
    engine.tail = Recorder(engine.tail)
    engine.weights.log = []
    for step in range(STEPS):
        x, y = loader.next_batch()
        engine.step(x.double(), y, step)
    engine.drain(STEPS)
    copies = engine.peak_kept_bytes / engine.stage_bytes
    return engine.stage.index, engine.tail.lrs, engine.weights.log, copies


def check(schedule, variant, m=1):
    k, lrs, log, _ = run(schedule, variant, m)
    lag = STAGES - k - 1
    # every stage updates mini-batches 0..STEPS-1 in order (the drain applies the last ones), each at its own LR
    assert lrs == [lr_of(j) for j in range(STEPS)], (k, lrs)
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
        assert abs(shift - sum(lr_of(done + t) for t in range(n))) < 1e-15, (k, done, n, shift)
    backwards = {e[1]: e[2:] for e in log if e[0] == "B"}  # per micro-batch (rebuilt once per weight)
    if variant == "v2" or extra == 0:
        assert not backwards, backwards  # v2 reuses the forward's weights; without v1's extra term: the live ones
    else:  # v1 rebuilds at backward time, extra updates ahead of those done by then (lag 0: i // m of them)
        assert sorted(backwards) == list(range(STEPS)), (k, backwards)
        for done, (n, shift) in backwards.items():
            assert n == extra and abs(shift - sum(lr_of(done + t) for t in range(n))) < 1e-15, (k, done, n)
    return k


def test_async_updates_use_their_mini_batch_lr_and_predictions_their_updates_lrs(world3):
    for schedule, variant, m in [("async-predict", "v1", 1), ("async-predict", "v2", 1), ("async", "v1", 1),
                                 ("async-predict", "v1", 2), ("async-predict", "v2", 2)]:
        assert world3.run(check, schedule, variant, m) == [0, 1, 2]


def check_v2_copies():
    k, _, _, copies = run("async-predict", "v2")
    return copies


def test_v2_weight_copies_are_counted_per_micro_batch(world3):
    """v2 keeps one predicted copy per micro-batch in flight: stage k holds lag + 1 of them at most (the micro-
    batches between a forward and its backward), counted by a counter (the ids of freed dicts, reused, were
    undercounting them). The last stage (lag 0) predicts nothing: its forwards run on the live weights."""
    assert world3.run(check_v2_copies) == [3.0, 2.0, 0.0]


def test_v2_names_each_copy_even_when_python_reuses_a_freed_dict():
    from tessel.pipeline.predict import StageWeights

    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    w = StageWeights(dict(lin.named_parameters()), opt, "predict", stage=0, stages=2, variant="v2")
    keys = []
    for _ in range(4):
        weights, leaves, _, kept = w.make(ahead=1)
        keys.append(kept)
        del weights, leaves  # the engine drops the dict after the forward: its id is free for the next one
    assert len(set(keys)) == 4, keys


def test_prediction_error_example_measures_the_guess_against_the_weights_reached(tmp_path):
    """examples/prediction_error.py (docs/pipeline.md's "How close the guess comes") on a short run: SpecTrain's
    guess lands closer to the weights s updates later than the stale weights do (share left < 1), and more so
    for fewer updates ahead."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "prediction_error.py"
    r = subprocess.run([sys.executable, str(example), "--tasks", "classifier", "--steps", "60", "--every", "5"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if line.startswith("| classifier |")]
    assert [(row[2].split("(")[1].rstrip(") "), row[3].strip()) for row in rows] == [
        (phase, guess) for phase in ("early", "middle", "late", "all") for guess in ("linear", "decayed")]
    weights = [float(v) for v in rows[-2][4].split("/")]  # all steps, the linear guess: s = 1, 2, 3
    assert 0 < weights[0] < weights[1] < weights[2] < 1, r.stdout
