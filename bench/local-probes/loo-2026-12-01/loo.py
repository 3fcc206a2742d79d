"""Could a per-cell calibration of a pipeline's per-micro-batch cost (and of compute speed) meet issue 41's goals?
An oracle bound, not a trial: for each of the 17 saved 3-round planner cells, each candidate's own day's price is
corrected by values fitted, by least squares, on the cell's OTHER candidates' measurements (leave one out), so no
candidate's own measurement enters its corrected price. Models of the correction:
  pm      measured = price + slots * pm            (pm: seconds per micro-batch slot on the critical path)
  a       measured = a * price                     (a compute-and-comm scale: rank-preserving)
  a+pm    measured = a * price + slots * pm
slots: pp + m - 1 for a flushed pipeline, m for async-predict, 0 without a pipeline.
Prints per cell [median |error| %, worst %, Spearman] for each, and the goals met over the cells."""
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stage-2026-11-30"))
from cells import CELLS  # noqa: E402

from tessel.bench.plan_check import _saved  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402

CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")}}
BENCH = Path(__file__).resolve().parents[2]


def stats(pred, meas):
    err = [p / m - 1 for p, m in zip(pred, meas)]
    return [round(100 * statistics.median(map(abs, err))), round(100 * max(err, key=abs)),
            round(float(spearmanr(pred, meas)[0]), 2)]


def slots(plan):
    if plan.pp == 1:
        return 0.0
    return plan.pp + plan.micro_batches - 1 if plan.schedule.flushed else plan.micro_batches


def fit(cols, y):
    """Least squares, relative error weighted (each row over its measurement), coefficients kept >= 0."""
    a = np.array(cols, dtype=float).T / y[:, None]
    sol = np.linalg.lstsq(a, np.ones(len(y)), rcond=None)[0]
    return np.maximum(sol, 0.0)


def loo(price, s, meas, model):
    out = []
    for i in range(len(meas)):
        keep = [j for j in range(len(meas)) if j != i]
        p, q, y = price[keep], s[keep], meas[keep]
        if model == "pm":
            (pm,) = fit([q], y - p + 0 * p) if q.any() else (0.0,)
            # y - p = q * pm: relative weighting on y
            pm = max(0.0, float(np.sum(q * (y - p) / y**2) / np.sum(q * q / y**2))) if q.any() else 0.0
            out.append(price[i] + s[i] * pm)
        elif model == "a":
            (a,) = fit([p], y)
            out.append(a * price[i])
        else:
            a, pm = fit([p, q], y)
            out.append(a * price[i] + s[i] * pm)
    return out


goals = {k: [0, 0, 0] for k in ("as run", "pm", "a", "a+pm")}
for (model, hosts, rate), folder in CELLS.items():
    d = BENCH / folder
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate
            and r.get("measured")]
    price, s, meas = [], [], []
    for r in rows:
        plan = ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" /
                                       f"{r['plan'].replace(' ', '-')}.json").read_text())
        price.append(r.get("predicted_at_run", r["predicted"]))
        s.append(slots(plan))
        meas.append(r["measured"])
    price, s, meas = map(np.array, (price, s, meas))
    res = {"as run": stats(price, meas)}
    for m in ("pm", "a", "a+pm"):
        res[m] = stats(loo(price, s, meas, m), meas)
    for k, (med, worst, rho) in res.items():
        goals[k][0] += med <= 10
        goals[k][1] += abs(worst) <= 30
        goals[k][2] += rho >= 0.8
    print(json.dumps({"cell": f"{model} {hosts}h {rate}", "n": len(rows), **res}))
print("cells meeting [median <= 10%, worst <= 30%, Spearman >= 0.8] of", len(CELLS), json.dumps(goals))
