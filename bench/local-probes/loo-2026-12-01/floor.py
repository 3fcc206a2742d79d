"""The measurements' own reproducibility on the 17 saved 3-round planner cells: each candidate's round i predicted by
the mean of its other two rounds (the same plan measured again), [median |error| %, worst %] over the cell's 24
(candidate, round) pairs, and the Spearman of each round's times against the other two rounds' means (the median of
the three). A planner judged against one round cannot do better than this; against the median of three rounds its
floor is lower, by about the square root of three for independent rounds."""
import json
import statistics
import sys
from pathlib import Path

from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stage-2026-11-30"))
from cells import CELLS  # noqa: E402

from tessel.bench.plan_check import _saved  # noqa: E402

CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")}}
BENCH = Path(__file__).resolve().parents[2]
for (model, hosts, rate), folder in CELLS.items():
    rows = [r for r in _saved(BENCH / folder)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate
            and len(r.get("runs") or []) >= 3]
    err, rhos = [], []
    for i in range(3):
        this = [r["runs"][i] for r in rows]
        other = [statistics.mean(x for j, x in enumerate(r["runs"][:3]) if j != i) for r in rows]
        err += [o / t - 1 for o, t in zip(other, this)]
        rhos.append(float(spearmanr(other, this)[0]))
    print(json.dumps({"cell": f"{model} {hosts}h {rate}", "n": len(rows),
                      "median": round(100 * statistics.median(map(abs, err))),
                      "worst": round(100 * max(err, key=abs)), "spearman": round(statistics.median(rhos), 2)}))
