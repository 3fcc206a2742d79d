"""Does bf16-mixed cost accuracy? The same `tessel train` run in fp32 and in bf16-mixed, several seeds, held-out
loss at the end of each (tessel's own held-out evaluation, samples no step trained on), and the relative
difference bf16-mixed vs fp32 per seed with its 95% interval over seeds (a t interval on the paired differences).

    python examples/precision_accuracy.py --seeds 0,1,2 --out runs/precision-accuracy            # the default run
    python examples/precision_accuracy.py --seeds 0,1,2 --out runs/precision-zipf -- --data.source zipf --steps 2400

Arguments after ``--`` go to every `tessel train` (both precisions alike). Runs alternate precisions seed by seed.
``--report-only`` trains nothing: it reads each run's summary.json under ``--out`` (``fp32-s0``, ``bf16-mixed-s0``,
...), so runs made one `tessel train` at a time (or several at once) are reported the same way; flags after ``--``
are then only recorded (give the ones the runs were made with).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path


def launch(args: list[str]) -> None:
    """`tessel ARGS` in its own process, as a user would run it."""
    subprocess.run([sys.executable, "-m", "tessel", *args], check=True, stdout=subprocess.DEVNULL)


def run(seed: int, precision: str, extra: list[str], out: Path, train: bool = True) -> float:
    """One `tessel train` (unless ``train`` is false: a finished one's); its final held-out loss."""
    folder = out / f"{precision}-s{seed}"
    if train:
        launch(["train", "--seed", str(seed), "--train.precision", precision, "--metrics.progress", "log",
                "--metrics.plot", "false", "--metrics.memory", "false", *extra, "--out", str(folder)])
    return json.loads((folder / "summary.json").read_text())["heldout"]["final"]["loss"]


def interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t interval of ``diffs`` (scipy's t quantile)."""
    from scipy import stats

    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="runs/precision-accuracy")
    p.add_argument("--report-only", action="store_true", help="read the finished runs under --out; train nothing")
    p.add_argument("extra", nargs="*", help="after --: flags for every tessel train")
    ns = p.parse_args()
    out, rows = Path(ns.out), []
    for seed in (int(s) for s in ns.seeds.split(",")):
        order = ("fp32", "bf16-mixed") if seed % 2 == 0 else ("bf16-mixed", "fp32")
        losses = {prec: run(seed, prec, ns.extra, out, not ns.report_only) for prec in order}
        rows.append((seed, losses["fp32"], losses["bf16-mixed"]))
        print(f"seed {seed}: held-out loss fp32 {losses['fp32']:.4f}, bf16-mixed {losses['bf16-mixed']:.4f}, "
              f"{100 * (losses['bf16-mixed'] / losses['fp32'] - 1):+.2f}%", flush=True)
    mean, lo, hi = interval([100 * (b / a - 1) for _, a, b in rows])
    print(f"bf16-mixed vs fp32, held-out loss: {mean:+.2f}% ({lo:+.2f}% to {hi:+.2f}%, 95% t interval over "
          f"{len(rows)} seeds); flags: {' '.join(ns.extra) or '(defaults)'}")
    (out / "results.json").write_text(json.dumps({"flags": ns.extra, "rows": rows, "mean_pct": mean,
                                                  "interval_pct": [lo, hi]}, indent=1))


if __name__ == "__main__":
    main()
