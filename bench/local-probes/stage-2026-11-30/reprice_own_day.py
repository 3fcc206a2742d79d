"""The 14 saved 3-round cells, each candidate's own day's price (as run) against the same price plus a stage cost
of 3.96 ms at speed 1 per micro-batch (divided by the cell's probed speed) on the critical path of a pipelined
plan (m micro-batches on its slowest stage): no fresh profile, so today's machine drift does not enter.
[median |error| %, worst %, Spearman] before -> after."""
import json, statistics, sys
from pathlib import Path

from cells import CELLS
from scipy.stats import spearmanr
from tessel.bench.plan_check import _saved
from tessel.plan import ParallelPlan
STAGE = 3.96e-3
def stats(pred, meas):
    err = [p / m - 1 for p, m in zip(pred, meas)]
    return [round(100 * statistics.median(map(abs, err))), round(100 * max(err, key=abs)), round(spearmanr(pred, meas)[0], 2)]
for (model, hosts, rate), folder in CELLS.items():
    d = Path("/work/main/bench") / folder
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate and r.get("measured")]
    before, after, meas = [], [], []
    for r in rows:
        plan = ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" / f"{r['plan'].replace(' ', '-')}.json").read_text())
        p = r.get("predicted_at_run", r["predicted"])
        before.append(p); meas.append(r["measured"])
        after.append(p + (plan.micro_batches * STAGE / r["speed"] if plan.pp > 1 else 0.0))
    print(json.dumps({"cell": f"{model} {hosts}h {rate}", "n": len(rows), "before": stats(before, meas), "after": stats(after, meas)}))
