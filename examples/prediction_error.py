"""How close does weight prediction come to the weights an asynchronous stage's gradient is applied to?

In a 4-stage pipeline at one micro-batch per step, stage k's forward runs s = 3 − k updates before the update
its gradient goes into, so its gradient is taken at the wrong weights: W_t instead of W_{t+s}. SpecTrain
guesses W_{t+s} from the optimizer's state at t. This script trains the flushed baseline in one process (the
accuracy protocol's tasks, optimizers and LR schedule, ``examples/pipeline_accuracy.py``) and at every step
compares the guesses with the weights the run then reaches, s = 1, 2, 3 updates later:

- ``stale``: W_t, what ``async`` and ``async-stash`` use;
- ``linear``: W_t − (η_{t+1} + … + η_{t+s})·v_t, SpecTrain's (tessel's ``async-predict``), v_t the optimizer's
  direction (``tessel.pipeline.predict.direction``: SGD's momentum buffer, Adam's m̂/(√v̂+ε) plus AdamW's decay);
- ``decayed``: the same with the i-th update's term scaled by β^i (β: SGD's momentum or Adam's β₁), the
  momentum decaying as if no new gradient came (FTPipe's msnag);
- ``opt``: the optimizer's own next s updates from its state with no new gradient (``async-predict`` with
  ``--pipeline.predict opt``; ``tessel.pipeline.predict.rolled``): for SGD with momentum the decayed guess; for
  Adam(W) each step's moments, bias corrections and decoupled decay as the optimizer applies them (XPipe,
  PipeOptim).

Reported per task and s, as medians over the steps after warm-up (the whole model taken s updates stale, as a
stage is):
- weights left: ‖guess − W_{t+s}‖ / ‖W_t − W_{t+s}‖, the share of the staleness a guess leaves (1 for ``stale``);
- gradient left: the same for the gradient a batch gives at the guess against at W_{t+s} (what the update
  receives), every ``--every`` steps;
- stale gradient error: ‖g(W_t) − g(W_{t+s})‖ / ‖g(W_{t+s})‖, how much staleness changes a gradient at all, which
  says how sensitive a task is to the error a guess leaves.

    python examples/prediction_error.py                        # classifier and Zipf LM, 2400 steps (3 minutes)
    python examples/prediction_error.py --tasks transformer_text       # the LM on real text (its corpus into --out)
    python examples/prediction_error.py --tasks classifier --steps 300
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections import deque
from pathlib import Path

import torch
from torch.nn.utils import vector_to_parameters

from tessel.config import load_config
from tessel.data.loader import ShardedLoader
from tessel.pipeline.predict import direction, rolled
from tessel.resolve import settings_of
from tessel.train.build import build, build_data
from tessel.train.optim import build_optimizer, set_lr

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_accuracy import TASKS, text_corpus  # noqa: E402  (the same tasks and hyper-parameters)

AHEAD = (1, 2, 3)  # s of stages 2, 1, 0 of 4 at one micro-batch per step
GUESSES = ("linear", "decayed", "opt")


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def guesses(opt, params, steps_lr: list[float], beta: float) -> dict[str, dict[int, torch.Tensor]]:
    """The guesses (``GUESSES``) of the weights s = 1..3 updates from now; steps_lr: those updates' LRs."""
    w = flat(params)
    v = flat(direction(opt, p) for p in params)
    out = {"linear": {}, "decayed": {}, "opt": {}}
    for s in AHEAD:
        out["linear"][s] = w - sum(steps_lr[:s]) * v
        out["decayed"][s] = w - sum(lr * beta ** (i + 1) for i, lr in enumerate(steps_lr[:s])) * v
        out["opt"][s] = flat(rolled(opt, p, steps_lr[:s]) for p in params)
    return out


def measure(task: str, steps: int, seed: int, every: int, out: Path) -> dict[str, dict]:
    extra = [f"data.path={text_corpus(out / 'text')[0]}"] if task == "transformer_text" else []
    cfg = load_config(None, [*TASKS[task], *extra, f"train.seed={seed}", f"train.steps={steps}", "train.warmup=20",
                             "train.clip=0"])
    torch.manual_seed(seed)
    data = build_data(cfg)
    model = build(cfg, getattr(data, "vocab_size", 0))
    probe = copy.deepcopy(model)  # gradients at other weights, on the same batch
    params = [p for p in model.parameters() if p.requires_grad]
    settings = settings_of(cfg)
    opt = build_optimizer(params, settings)
    beta = opt.param_groups[0].get("momentum") or opt.param_groups[0]["betas"][0]
    loader = ShardedLoader(data, cfg.train.global_batch, 0, 1, seed=seed)

    def grad_at(w: torch.Tensor, batch) -> torch.Tensor:
        vector_to_parameters(w.to(params[0].dtype), probe.parameters())
        probe.zero_grad()
        probe(*batch).backward()
        return flat(p.grad for p in probe.parameters())

    pending: deque = deque()  # (step t, W_t, guesses made at t, a batch or None)
    names = GUESSES
    left = {k: {n: {s: [] for s in AHEAD} for n in names} for k in ("weights", "gradient")}
    stale_grad = {s: [] for s in AHEAD}
    for t in range(steps):
        set_lr(opt, settings.lr_at(t))
        x, y = loader.next_batch()
        opt.zero_grad()
        model(x, y).backward()
        opt.step()
        w = flat(params)  # W_{t+1}: t + 1 updates done
        for t0, w0, g, batch in pending:
            s = t + 1 - t0
            stale = (w0 - w).norm()
            if s not in AHEAD or t0 <= cfg.train.warmup or stale == 0:
                continue
            for n in names:
                left["weights"][n][s].append((t0, float((g[n][s] - w).norm() / stale)))
            if batch is not None:
                true, old = grad_at(w, batch), grad_at(w0, batch)
                stale_grad[s].append((t0, float((old - true).norm() / true.norm())))
                for n in names:
                    err = (grad_at(g[n][s], batch) - true).norm() / (old - true).norm()
                    left["gradient"][n][s].append((t0, float(err)))
        while pending and t + 1 - pending[0][0] >= max(AHEAD):
            pending.popleft()
        ahead_lr = [settings.lr_at(t + 1 + i) for i in range(max(AHEAD))]
        # early training moves fastest and has the fewest steps: compare there 5 times as often
        batch = loader.peek() if (t + 1) % (every if t + 1 >= steps // 10 else max(1, every // 5)) == 0 else None
        pending.append((t + 1, w, guesses(opt, params, ahead_lr, beta), batch))
    return {phase: {"left": {k: {n: {s: _median(v, lo, hi) for s, v in by_s.items()} for n, by_s in d.items()}
                             for k, d in left.items()},
                    "stale_gradient": {s: _median(v, lo, hi) for s, v in stale_grad.items()}}
            for phase, (lo, hi) in phases(steps, cfg.train.warmup).items()}


def phases(steps: int, warmup: int) -> dict[str, tuple[int, int]]:
    """Windows of the run (the step t a guess is made at): early training, the rest of the first half, the
    second half (where the cosine LR decays to zero), and all of it after warm-up."""
    early = max(warmup + 1, steps // 10)
    return {"early": (warmup + 1, early), "middle": (early, steps // 2), "late": (steps // 2, steps),
            "all": (warmup + 1, steps)}


def _median(pairs: list[tuple[int, float]], lo: int, hi: int) -> float:
    values = [v for t, v in pairs if lo <= t < hi]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="classifier,transformer_lm")
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/prediction-error", help="where the text task's corpus files go")
    ap.add_argument("--every", type=int, default=20, help="steps between gradient comparisons (4 backwards each)")
    a = ap.parse_args()
    print("| task | steps | guess | weights left, s = 1 / 2 / 3 | gradient left, s = 1 / 2 / 3 "
          "| stale gradient error, s = 1 / 2 / 3 |\n|---|---|---|---|---|---|")
    for task in a.tasks.split(","):
        for phase, m in measure(task, a.steps, a.seed, a.every, Path(a.out)).items():
            lo, hi = phases(a.steps, 20)[phase]
            stale = " / ".join(f"{v:.3f}" for v in m["stale_gradient"].values())
            for name in GUESSES:
                cells = [" / ".join(f"{m['left'][k][name][s]:.3f}" for s in AHEAD) for k in ("weights", "gradient")]
                print(f"| {task} | {lo}–{hi} ({phase}) | {name} | {cells[0]} | {cells[1]} | {stale} |", flush=True)

if __name__ == "__main__":
    main()
