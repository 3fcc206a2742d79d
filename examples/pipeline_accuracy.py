"""Accuracy protocol for asynchronous pipelines: does weight prediction remove the cost of staleness?

Every run trains the same model with the same data, global batch, optimizer, learning-rate schedule and
number of updates; only the schedule differs. Pipelines use 4 stages and one micro-batch per step, which
is SpecTrain's setting and the stalest one: stage k's forward meets weights N − k − 1 = 3, 2, 1, 0 updates
older than the ones its gradient is applied to. Runs:

- ``single``: one process, the reference; ``1f1b``: flushed pipeline (must equal ``single``);
- ``async``: no flush, no stashing (stale and inconsistent weights); ``async-stash``: PipeDream;
- ``async-predict``: SpecTrain (v1 by default; ``--variants v1,v2`` adds v2).

After training, the final weights (loaded from the run's checkpoint into one process) are evaluated on
samples no run has seen. Reported: held-out loss (and accuracy for the classifier), mean ± std over seeds,
every seed's value, and each schedule's gap to ``1f1b``.

    python examples/pipeline_accuracy.py --out runs/pp-accuracy              # 2 tasks x 5 runs x 3 seeds
    python examples/pipeline_accuracy.py --tasks classifier --seeds 0 --steps 50
    python examples/pipeline_accuracy.py --micro 4 --out runs/pp-accuracy-m4   # the benchmark's micro-batching
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

TASKS = {
    # SGD with momentum, as in the paper; a noisy 10-class problem that is not solved in the budget
    "classifier": ["model.name=classifier", "model.in_features=64", "model.hidden=128", "model.layers=5",
                   "model.classes=10", "data.separation=3", "train.optimizer=sgd", "train.lr=0.05",
                   "train.momentum=0.9", "train.global_batch=32"],
    # AdamW, where extrapolating Adam's moments is the risky case
    "transformer_lm": ["model.name=transformer_lm", "model.dim=64", "model.layers=4", "model.heads=4",
                       "data.vocab_size=512", "data.seq_len=32", "train.optimizer=adamw", "train.lr=3e-3",
                       "train.global_batch=16"],
}
EVAL_FIRST, EVAL_N = 10_000_000, 1024  # sample ids far beyond anything trained on


def runs(variants: list[str], micro: int = 1) -> dict[str, list[str]]:
    pp = ["parallel.nproc=4", "parallel.pp=4", f"train.micro_batches={micro}"]
    out = {"single": ["parallel.nproc=1", "parallel.pp=1"], "1f1b": [*pp, "pipeline.schedule=1f1b"],
           "async": [*pp, "pipeline.schedule=async"], "async-stash": [*pp, "pipeline.schedule=async-stash"]}
    for v in variants:
        out[f"async-predict-{v}"] = [*pp, "pipeline.schedule=async-predict", f"pipeline.predict={v}"]
    return out


def train(overrides: list[str], out: Path) -> None:
    cmd = [sys.executable, "-m", "tessel", "train", "--metrics.progress", "off", "--metrics.plot", "false",
           "--out", str(out)] + [a for o in overrides for a in ("--set", o)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")


def evaluate(overrides: list[str], out: Path) -> dict[str, float]:
    """Held-out loss (and accuracy) of the run's final weights, in one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tessel.config import load_config
    from tessel.train import checkpoint
    from tessel.train.build import build, build_data

    cfg = load_config(None, overrides)
    data = build_data(cfg)
    model = build(cfg, getattr(data, "vocab_size", 0))
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(checkpoint.latest(out / "checkpoints")), f"{tmp}/w.pt")
        state = torch.load(f"{tmp}/w.pt", weights_only=False)["model"]
    model.load_state_dict(state)
    model.eval()
    x, y = data.get_batch(np.arange(EVAL_FIRST, EVAL_FIRST + EVAL_N))
    with torch.no_grad():
        logits = model.logits(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        acc = (logits.argmax(-1) == y).float().mean()
    return {"loss": float(loss), "accuracy": float(acc) * 100}


def table(results: dict, tasks: list[str], names: list[str]) -> str:
    lines = []
    for task in tasks:
        ref = statistics.mean(r["loss"] for r in results[task]["1f1b"])
        ref_acc = statistics.mean(r["accuracy"] for r in results[task]["1f1b"])
        lines += [f"**{task}** (held-out, {EVAL_N} samples)", "",
                  "| run | loss mean ± std | vs 1f1b | accuracy % mean ± std | vs 1f1b (points) | per seed (loss) |",
                  "|---|---|---|---|---|---|"]
        for name in names:
            rs = results[task][name]
            loss = [r["loss"] for r in rs]
            acc = [r["accuracy"] for r in rs]
            sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
            mean_loss, mean_acc = statistics.mean(loss), statistics.mean(acc)
            lines.append(f"| {name} | {mean_loss:.4f} ± {sd(loss):.4f} | {(mean_loss / ref - 1) * 100:+.2f}% | "
                         f"{mean_acc:.2f} ± {sd(acc):.2f} | {mean_acc - ref_acc:+.2f} | "
                         f"{', '.join(f'{v:.4f}' for v in loss)} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/pp-accuracy")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--variants", default="v1")
    ap.add_argument("--micro", type=int, default=1,
                    help="micro-batches per step in the pipelines (1: SpecTrain's setting, the stalest)")
    a = ap.parse_args()
    tasks, seeds = a.tasks.split(","), [int(s) for s in a.seeds.split(",")]
    names = list(runs(a.variants.split(",")))
    out = Path(a.out)
    results: dict = {t: {n: [] for n in names} for t in tasks}
    for task in tasks:
        for seed in seeds:
            for name, extra in runs(a.variants.split(","), a.micro).items():
                overrides = [*TASKS[task], *extra, f"train.seed={seed}", f"train.steps={a.steps}",
                             "train.warmup=20", "train.clip=0"]
                d = out / f"{task}-{name}-s{seed}"
                train(overrides, d)
                r = evaluate(overrides, d)
                results[task][name].append(r)
                print(f"{task:<15} {name:<17} seed {seed}: loss {r['loss']:.4f}  acc {r['accuracy']:.2f}%",
                      flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    md = table(results, tasks, names)
    (out / "report.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
