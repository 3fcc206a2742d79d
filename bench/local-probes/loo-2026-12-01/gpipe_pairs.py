"""GPipe against 1F1B on the same plan otherwise (same cell, same axes, micro-batches, recompute), measured in the
same rounds of the 17 saved 3-round planner cells: the planner prices the two alike. Per pair the ratio of the
3-round medians, and the per-round ratios; m = 1 pairs run the same order of operations and are the control."""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stage-2026-11-30"))
from cells import CELLS  # noqa: E402

from tessel.bench.plan_check import _saved  # noqa: E402

CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")}}
BENCH = Path(__file__).resolve().parents[2]
out = {"m1": [], "m>1": []}
for (model, hosts, rate), folder in CELLS.items():
    rows = {r["plan"]: r for r in _saved(BENCH / folder)[1] if r["model"] == model and r["hosts"] == hosts
            and r["rate"] == rate and r.get("measured")}
    for name, r in rows.items():
        if " gpipe " not in f" {name} ":
            continue
        other = rows.get(name.replace("gpipe", "1f1b"))
        if not other:
            continue
        per_round = [g / f for g, f in zip(r["runs"], other["runs"])]
        m = int(name.split(" m")[1].split()[0])
        out["m1" if m == 1 else "m>1"].append(r["measured"] / other["measured"])
        print(f"{model:15s} {hosts}h {rate:8s} {name:42s} gpipe/1f1b {r['measured'] / other['measured']:.2f}"
              f"  rounds {[round(x, 2) for x in per_round]}")
for k, v in out.items():
    print(f"{k}: {len(v)} pairs, median {statistics.median(v):.2f}, range {min(v):.2f}-{max(v):.2f}, "
          f"slower in {sum(x > 1 for x in v)}")
