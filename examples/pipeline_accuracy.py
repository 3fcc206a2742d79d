"""Accuracy protocol for asynchronous pipelines, run to convergence: does weight prediction remove the
cost of staleness once training has plateaued?

Every run trains the same model with the same data, global batch, optimizer, learning-rate schedule (20
warm-up steps, cosine decay to zero at the last step) and number of updates; only the schedule differs.
Pipelines use 4 stages. With one micro-batch per step (SpecTrain's setting, the stalest) stage k's forward
meets weights N − k − 1 = 3, 2, 1, 0 updates older than the ones its gradient is applied to; with 4
micro-batches only the first N − k − 1 micro-batches of a step are one update behind.

The cut is pinned (``--split``, default per task in ``SPLITS``). An asynchronous schedule's math depends on it:
the layers on stage k run up to N − k − 1 updates stale, so a run on another cut is another run. Left to the
profile, the cut follows sub-millisecond timings: on the text Transformer four different cuts came up across
runs of the same command, and async-predict on seed 0 ended at held-out loss 4.70 on one and 3.95 on another.
``SPLITS`` holds the cut the profile picks on this machine when nothing else runs (10 of 10 profiles for the
classifier and the Zipf Transformer, 7 of 10 for the text Transformer); flushed schedules compute the same on every cut.

Budget (``--steps auto``): the flushed baseline is trained in one process (its updates equal ``1f1b``'s)
on the plateau seeds at T = 300, 600, 1200, ... steps; the budget is the first T whose doubling lowers the
mean held-out loss by less than 1% (relative). A held-out loss that rises when the budget doubles (over-
fitting on a finite corpus) also ends the search. Every schedule then trains for that budget.

Runs per task, seed and micro-batch count: ``single`` (one process, once per seed), ``1f1b`` (flushed;
must equal ``single`` at one micro-batch), ``async`` (stale), ``async-stash`` (PipeDream),
``async-predict-v1`` (SpecTrain; ``--variants v1,v2,opt`` adds the others, ``opt:1200`` with PipeMare's LR
rescheduling over 1200 steps, ``nag`` the Nesterov method ``async-nag``, ``nag-flushed`` its optimizer flushed
``single-nag``, ``nag:0.08`` with NAdam's psi at 0.08; ``--baselines 1f1b`` leaves out ``async`` and
``async-stash``, ``--baselines none`` every pipeline baseline: the tables are then against ``single``).
The final weights, loaded from the run's checkpoint into one process, are evaluated on samples no run trained
on.
Reported: held-out loss and accuracy (mean ± std over seeds, every seed's value), each schedule's gap to
``1f1b``, and paired tests over seeds (t-test on the per-seed relative loss gap, its mean and 95% interval).

Tasks:
- ``classifier``: 64 → 5 × 128 → 10 classes on Gaussian clusters of mean norm 3 (learnable, not trivial),
  SGD with momentum 0.9 (the paper's optimizer and predictor);
- ``transformer_lm``: 4 blocks of width 64 on tessel's embedded Zipf corpus (vocabulary 512), AdamW;
- ``transformer_text``: the same model on real English text, Python's own documentation as shipped with
  the standard library (``pydoc_data.topics``), tokenized with tessel's word-level tokenizer (vocabulary
  1024); every tenth topic is held out.

    python examples/pipeline_accuracy.py --steps auto --seeds 0,1,2,3,4 --micro 1,4 --out runs/pp-conv
    python examples/pipeline_accuracy.py --tasks classifier --seeds 0 --steps 50      # a quick look
    python examples/pipeline_accuracy.py --steps 300 --seeds 0,1,2 --micro 1          # the 300-step protocol
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

LM = ["model.name=transformer_lm", "model.dim=64", "model.layers=4", "model.heads=4", "data.seq_len=32",
      "train.optimizer=adamw", "train.lr=3e-3", "train.global_batch=16"]
TASKS = {
    "classifier": ["model.name=classifier", "model.in_features=64", "model.hidden=128", "model.layers=5",
                   "model.classes=10", "data.separation=3", "train.optimizer=sgd", "train.lr=0.05",
                   "train.momentum=0.9", "train.global_batch=32"],
    "transformer_lm": [*LM, "data.vocab_size=512"],
    "transformer_text": [*LM, "data.source=text", "data.vocab_size=1024"],  # data.path set by text_corpus
}
# layer counts per stage (pipeline.split); the chains have 6 layers: classifier 5 x (Linear, ReLU) + head,
# Transformer embed + 4 blocks + head
SPLITS = {"classifier": "2,1,1,2", "transformer_lm": "2,1,1,2", "transformer_text": "2,2,1,1"}
PLATEAU_SEEDS, PLATEAU_GAIN, FIRST_BUDGET = (0, 1), 0.01, 300


def text_corpus(out: Path) -> tuple[Path, Path]:
    """Python's documentation topics as train.txt and heldout.txt (every tenth topic, by sorted name)."""
    import pydoc_data.topics

    topics = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    out.mkdir(parents=True, exist_ok=True)
    train, held = out / "train.txt", out / "heldout.txt"
    train.write_text("\n".join(t for i, t in enumerate(topics) if i % 10 != 9))
    held.write_text("\n".join(t for i, t in enumerate(topics) if i % 10 == 9))
    return train, held


BASELINES = ("1f1b", "async", "async-stash")  # the pipelines without prediction, in the tables' order


SINGLE = ["parallel.nproc=1", "parallel.pp=1"]
# the Nesterov method (Ajanthan et al., ICML 2025) as its authors' code runs it: PipeDream's weight stashing and
# torch's NAdam with decoupled weight decay at beta1 0.99; ``single-nag`` is the same optimizer flushed, one process
NAG = ["train.optimizer=nadamw", "train.beta1=0.99"]


def predict_names(variant: str) -> list[str]:
    """``v1`` -> [async-predict-v1]; ``opt:1200`` (a variant with PipeMare's LR rescheduling over 1200 steps) ->
    [async-predict-opt-delay1200]; ``nag`` -> [async-nag] (the Nesterov method), ``nag-flushed`` -> [single-nag]
    (its optimizer, flushed), ``nag:0.08`` -> [async-nag-psi0.08] (NAdam's momentum ramp psi at 0.08)."""
    name, _, delay = variant.partition(":")
    if name in ("nag", "nag-flushed"):
        return [("async" if name == "nag" else "single") + "-nag" + (f"-psi{delay}" if delay else "")]
    return [f"async-predict-{name}" + (f"-delay{delay}" if delay else "")]


def schedules(variants: list[str], micro: int, split: str, baselines=BASELINES) -> dict[str, list[str]]:
    pp = ["parallel.nproc=4", "parallel.pp=4", f"train.micro_batches={micro}", f"pipeline.split={split}"]
    out = {b: [*pp, f"pipeline.schedule={b}"] for b in BASELINES if b in baselines}
    for v in variants:
        name, _, psi = v.partition(":")
        if name in ("nag", "nag-flushed"):
            nag = [*NAG, *([f"train.momentum_decay={psi}"] if psi else [])]
            stale = [*pp, "pipeline.schedule=async-stash", *nag]
            out[predict_names(v)[0]] = stale if name == "nag" else [*SINGLE, *nag]
            continue
        name, _, delay = v.partition(":")
        out[predict_names(v)[0]] = [*pp, "pipeline.schedule=async-predict", f"pipeline.predict={name}",
                                    *([f"pipeline.delay_lr={delay}"] if delay else [])]
    return out


def train_args(overrides: list[str], out: Path) -> list[str]:
    """The `tessel train` arguments of one run."""
    return ["train", "--metrics.progress", "off", "--metrics.plot", "false", "--metrics.heldout", "false",
            "--metrics.memory", "false", "--out", str(out)] + [a for o in overrides for a in ("--set", o)]


def launch(args: list[str]) -> None:
    """`tessel ARGS` in its own process, as a user would run it."""
    r = subprocess.run([sys.executable, "-m", "tessel", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run failed: tessel {' '.join(args)}\n{r.stderr[-2000:]}")


def held_out(data, heldout: Path | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) no run trained on: the held-out samples of tessel train's own report (far sample ids),
    or windows of the held-out text."""
    from tessel.train import heldout as embedded

    if heldout is None:
        return embedded.batch(data)
    lines = heldout.read_text().splitlines()
    ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in data.tokenizer.encode_batch(lines)])
    n, t = min(embedded.SAMPLES, (len(ids) - 1) // data.seq_len), data.seq_len
    windows = torch.from_numpy(ids[: n * t + 1])
    return windows[:-1].reshape(n, t), windows[1:].reshape(n, t)  # (n, t): targets are inputs shifted by 1


def evaluate(overrides: list[str], out: Path, heldout: Path | None) -> dict[str, float]:
    """Held-out loss and accuracy (classes, or next tokens) of the run's final weights, in one process (loaded
    as tessel loads any checkpoint: verified, and no code run from its files)."""
    from tessel.config import load_config
    from tessel.train import checkpoint
    from tessel.train import heldout as embedded
    from tessel.train.build import build, build_data

    cfg = load_config(None, overrides)
    data = build_data(cfg)
    model = build(cfg, getattr(data, "vocab_size", 0))
    final = checkpoint.latest(out / "checkpoints")
    checkpoint.load_weights(final, model, {"model": checkpoint.read_meta(final)["model"]})
    x, y = held_out(data, heldout)
    classes = cfg.model.classes if cfg.model.name == "classifier" else data.vocab_size
    return embedded.evaluate(model, x, y, classes)


def run(task_args: list[str], extra: list[str], seed: int, steps: int, out: Path, heldout) -> dict:
    overrides = [*task_args, *extra, f"train.seed={seed}", f"train.steps={steps}", "train.warmup=20",
                 "train.clip=0"]  # clipping off: a stage-local norm would differ from the global one
    if not (out / "summary.json").exists():  # written at a run's end: a stopped run's checkpoint is not final
        shutil.rmtree(out, ignore_errors=True)
        launch(train_args(overrides, out))
    return evaluate(overrides, out, heldout)


def plateau(task: str, task_args: list[str], out: Path, heldout, log: list[str], cap: int) -> int:
    """The first budget whose doubling improves the flushed baseline's held-out loss by < PLATEAU_GAIN."""
    def mean_loss(steps: int) -> float:
        losses = [run(task_args, SINGLE, s, steps, out / f"{task}-budget{steps}-s{s}", heldout)["loss"]
                  for s in PLATEAU_SEEDS]
        log.append(f"{task}: single, {steps} steps, held-out loss {statistics.mean(losses):.4f} "
                   f"(seeds {', '.join(f'{v:.4f}' for v in losses)})")
        print(log[-1], flush=True)
        return statistics.mean(losses)

    steps, loss = FIRST_BUDGET, mean_loss(FIRST_BUDGET)
    while steps < cap:
        longer = mean_loss(2 * steps)
        if longer > loss * (1 - PLATEAU_GAIN):
            return steps
        steps, loss = 2 * steps, longer
    log.append(f"{task}: stopped at the cap of {cap} steps before a plateau (not converged by this criterion)")
    print(log[-1], flush=True)
    return steps


def paired(a: list[float], b: list[float]) -> str:
    """Relative gap of a over b per seed: mean, 95% t interval and the t-test's p on those gaps."""
    from scipy import stats

    gaps = np.array(a) / np.array(b) - 1
    if len(gaps) < 2:
        return f"{gaps.mean() * 100:+.2f}% (one seed)"
    lo, hi = stats.t.interval(0.95, len(gaps) - 1, loc=gaps.mean(), scale=stats.sem(gaps))
    p = stats.ttest_1samp(gaps, 0.0).pvalue  # the same quantity as the interval: p < 0.05 iff it excludes 0
    shown = f"p={p:.3f}" if p >= 0.001 else "p<0.001"
    return f"{gaps.mean() * 100:+.2f}% ({lo * 100:+.2f} to {hi * 100:+.2f}), {shown}"


def table(rows: dict[str, list[dict]], names: list[str], predicts: list[str]) -> list[str]:
    """The report's table and paired tests; the reference is ``1f1b``, or ``single`` where no pipeline baseline
    ran (the flushed updates, trained in one process)."""
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    name0 = "1f1b" if "1f1b" in rows else "single"
    ref = statistics.mean(r["loss"] for r in rows[name0])
    ref_acc = statistics.mean(r["accuracy"] for r in rows[name0])
    lines = [f"| run | loss mean ± std | vs {name0} | accuracy % mean ± std | vs {name0} (points) | per seed (loss) |",
             "|---|---|---|---|---|---|"]
    for name in names:
        loss, acc = [r["loss"] for r in rows[name]], [r["accuracy"] for r in rows[name]]
        lines.append(f"| {name} | {statistics.mean(loss):.4f} ± {sd(loss):.4f} | "
                     f"{(statistics.mean(loss) / ref - 1) * 100:+.2f}% | {statistics.mean(acc):.2f} ± {sd(acc):.2f} | "
                     f"{statistics.mean(acc) - ref_acc:+.2f} | {', '.join(f'{v:.4f}' for v in loss)} |")
    lines += ["", "Paired over seeds, relative held-out loss gap (mean, 95% interval, t-test on the gaps):", ""]
    for i, predict in enumerate(predicts):  # each variant against the others, and against the variants before it
        for other in (name0, *(b for b in BASELINES if b in rows and b != name0), *predicts[:i]):
            lines.append(f"- {predict} vs {other}: "
                         f"{paired([r['loss'] for r in rows[predict]], [r['loss'] for r in rows[other]])}")
    return lines


def task_lr(task_args: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in task_args if a.startswith("train.lr="))


@dataclass
class Cell:
    """One task at one micro-batch count: trains (or finds) and evaluates any of its runs."""

    task: str
    task_args: list[str]
    steps: int
    micro: int
    split: str
    runs: dict[str, list[str]]  # run name -> its overrides (single, or a pipeline schedule)
    out: Path
    heldout: Path | None

    def trial(self, name: str, lr: str, seed: int) -> dict:
        tag = "" if lr == task_lr(self.task_args) else f"-lr{lr}"  # the task's own LR keeps the plain folder names
        where = (f"{self.task}-single-{self.steps}{tag}-s{seed}" if name == "single" else
                 f"{self.task}-m{self.micro}-{name}-{self.steps}-cut{self.split.replace(',', '')}{tag}-s{seed}")
        return run(self.task_args, [*self.runs[name], f"train.lr={lr}"], seed, self.steps, self.out / where,
                   self.heldout)


def pick_lrs(names: list[str], lrs: list[str], trial, log: list[str], fixed=None) -> dict[str, str]:
    """Each run's LR from the grid ``lrs``: the one whose mean held-out loss over PLATEAU_SEEDS is lowest
    (``trial(name, lr, seed)`` trains and evaluates one; a diverged one, NaN, loses), unless ``fixed`` gives it.
    ``1f1b`` takes ``single``'s: their updates are equal."""
    chosen = dict(fixed or {})
    for name in names:
        if name in chosen:
            continue
        if name == "1f1b":
            chosen[name] = chosen["single"]
            continue
        means = {lr: statistics.mean(trial(name, lr, s)["loss"] for s in PLATEAU_SEEDS) for lr in lrs}
        # a run that diverged (NaN) is the worst, not a min() that NaN's comparisons leave in first place
        chosen[name] = min(means, key=lambda lr: means[lr] if means[lr] == means[lr] else float("inf"))
        log.append(f"{name}: held-out loss on seeds {', '.join(map(str, PLATEAU_SEEDS))} at lr "
                   + ", ".join(f"{lr}: {v:.4f}" for lr, v in means.items()) + f" -> lr {chosen[name]}")
        print(log[-1], flush=True)
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/pp-conv")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--steps", default="auto", help="updates per run, or 'auto' (the plateau search)")
    ap.add_argument("--max-steps", type=int, default=9600, help="the budget search's cap (reported if reached)")
    ap.add_argument("--variants", default="v1", help="async-predict variants (tessel's pipeline.predict), each "
                                                     "optionally with PipeMare's LR rescheduling: v1,opt,opt:1200")
    ap.add_argument("--baselines", default=",".join(BASELINES), help="pipelines without prediction to run "
                                                                     "(1f1b, where run, is the tables' reference; "
                                                                     "none: single is)")
    ap.add_argument("--micro", default="1,4", help="micro-batches per step in the pipelines, comma-separated")
    ap.add_argument("--split", default="", help="layer counts per stage for every task (default: SPLITS' per task)")
    ap.add_argument("--lrs", default="", help="an LR grid, e.g. 3e-3,1e-3,3e-4: each run takes the grid's best on "
                                              "the plateau seeds (default: every run at the task's LR)")
    ap.add_argument("--run-lrs", default="", help="fixed LRs by run, e.g. single=1e-3,1f1b=1e-3,async-predict-v1=3e-4 "
                                                  "(a grid's earlier choice); the others as --lrs or the task's")
    ap.add_argument("--report-only", default="", metavar="RESULTS_JSON",
                    help="print the report of a finished protocol from its results (a committed "
                         "bench/pipeline-accuracy/*.json), training nothing")
    a = ap.parse_args()
    if a.report_only:
        print(render(json.loads(Path(a.report_only).read_text())))
        return
    tasks, seeds = a.tasks.split(","), [int(s) for s in a.seeds.split(",")]
    variants, micros, out = a.variants.split(","), [int(m) for m in a.micro.split(",")], Path(a.out)
    results, log = {}, []
    for task in tasks:
        task_args, heldout = list(TASKS[task]), None
        if task == "transformer_text":
            train_txt, heldout = text_corpus(out / "text")
            task_args.append(f"data.path={train_txt}")
        steps = plateau(task, task_args, out, heldout, log, a.max_steps) if a.steps == "auto" else int(a.steps)
        split = a.split or SPLITS[task]
        res = results[task] = {"steps": steps, "split": split}
        for micro in micros:
            runs = {"single": SINGLE, **schedules(variants, micro, split, set(a.baselines.split(",")))}
            cell = Cell(task, task_args, steps, micro, split, runs, out, heldout)
            fixed = dict(kv.split("=", 1) for kv in a.run_lrs.split(",") if kv)
            lrs = (pick_lrs(list(runs), a.lrs.split(","), cell.trial, log, fixed) if a.lrs
                   else {**dict.fromkeys(runs, task_lr(task_args)), **fixed})
            rows = res[f"m{micro}"] = {n: [] for n in runs}
            res[f"m{micro}-lr"], res[f"m{micro}-grid"] = lrs, a.lrs
            for seed in seeds:
                for name in runs:
                    r = cell.trial(name, lrs[name], seed)
                    rows[name].append(r)
                    print(f"{task:<16} m={micro} {name:<17} lr {lrs[name]} seed {seed}: loss {r['loss']:.4f} "
                          f"acc {r['accuracy']:.2f}%", flush=True)
            res["single"] = rows["single"]
            results["log"] = log
            (out / "results.json").write_text(json.dumps(results, indent=1))
    md = render(results)
    (out / "report.md").write_text(md)
    print(md)


def render(results: dict) -> str:
    """The report of a protocol from its results (every per-seed loss and accuracy it trained), so each table
    can be recomputed from the JSON a run leaves."""
    report = []
    for task, res in results.items():
        if task == "log":
            continue
        for key in (k for k in res if k.startswith("m") and k[1:].isdigit()):
            rows, lrs, grid = res[key], res[f"{key}-lr"], res.get(f"{key}-grid", "")
            at = ("" if not grid else ", each at its best LR of " + grid + " ("
                  + ", ".join(f"{n} {lr}" for n, lr in lrs.items()) + ")")
            predicts = [n for n in rows if n not in ("single", *BASELINES)]
            report += [f"**{task}**, {res['steps']} steps, {key[1:]} micro-batch(es) per step, cut {res['split']}{at}, "
                       "held-out", "", *table(rows, list(rows), predicts), ""]
    return "\n".join(["Budget search and LR choice:", "", *[f"- {line}" for line in results.get("log", [])], "",
                      *report])


if __name__ == "__main__":
    main()
