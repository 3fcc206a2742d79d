"""Every saved 3-round planner cell (22) priced on one fresh profile per model with a pipeline stage's CPU per
micro-batch beyond its layers (X ms at speed 1, over the cell's probed speed: ``Topology.per_micro``, pipelines only)
for X in 0 and the given values. Per X: cells meeting each goal [median |error| <= 10%, worst <= 30%, Spearman >=
0.8, the pick's measured time within 1.10x of the best's by median], and per cell the four figures. Cells with their
runs' CPU (the two cells of 2026-12-01/02, whose runs fitted X in beyond.py) are marked "fit"; the rest did not enter
the fit. Usage: python reprice_micro.py X [X ...]"""
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from scipy.stats import spearmanr

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "stage-2026-11-30"))
from cells import CELLS  # noqa: E402

from tessel.bench.plan_check import COMMON, MODELS, _saved  # noqa: E402
from tessel.cluster.emulate import parse_rate  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402
from tessel.planner import Topology  # noqa: E402
from tessel.planner.estimate import estimate  # noqa: E402
from tessel.planner.profile import measure  # noqa: E402
from tessel.resolve import job_of, policy_of, settings_of  # noqa: E402

FIT = {"plan-unseen-6h-200", "plan-unseen-2h-100"}
CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")},
         **{(m, 6, "200mbit"): "plan-unseen-6h-200" for m in ("classifier", "transformer_lm")},
         **{(m, 2, "100mbit"): "plan-unseen-2h-100" for m in ("classifier", "lstm_lm", "transformer_lm")}}
BENCH = HERE.parents[2]
xs = [0.0] + [float(x) for x in sys.argv[1:]]
loaded, plans_of = {}, {}
for (model, hosts, rate), folder in CELLS.items():
    d = BENCH / folder
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate
            and r.get("measured")]
    loaded[(model, hosts, rate)] = (d, rows)
    plans_of.setdefault(model, []).extend(
        ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" / f"{r['plan'].replace(' ', '-')}.json")
                               .read_text()) for r in rows)
profiles = {}
for model, plans in plans_of.items():
    cfg = load_config(None, [*MODELS[model], *COMMON])
    b = cfg.train.global_batch
    profiles[model] = measure(job_of(cfg), sizes=tuple(sorted({b // (p.dp * p.micro_batches) for p in plans})),
                              dps=tuple(sorted({p.dp for p in plans})))


def stats(pred, meas):
    err = [p / m - 1 for p, m in zip(pred, meas)]
    pick = min(range(len(pred)), key=pred.__getitem__)
    return [round(100 * statistics.median(map(abs, err))), round(100 * max(err, key=abs)),
            round(float(spearmanr(pred, meas)[0]), 2), round(meas[pick] / min(meas), 2)]


goals = {x: [0, 0, 0, 0] for x in xs}
held_out = {x: [0, 0, 0, 0] for x in xs}
for (model, hosts, rate), (d, rows) in loaded.items():
    cfg = load_config(None, [*MODELS[model], *COMMON])
    settings, profile = settings_of(cfg), profiles[model]
    meas = [r["measured"] for r in rows]
    line = {}
    for x in xs:
        pred = []
        for r in rows:
            plan = ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" /
                                           f"{r['plan'].replace(' ', '-')}.json").read_text())
            plan = plan.with_(sparse=policy_of(cfg))
            topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                            speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"])
            if plan.pp > 1:
                topo = replace(topo, per_micro=x * 1e-3 / r["speed"])
            pred.append(estimate(plan, settings, profile, topo).step)
        s = line[x] = stats(pred, meas)
        met = (s[0] <= 10, abs(s[1]) <= 30, s[2] >= 0.8, s[3] <= 1.10)
        goals[x] = [a + b for a, b in zip(goals[x], met)]
        if d.name not in FIT:
            held_out[x] = [a + b for a, b in zip(held_out[x], met)]
    print(json.dumps({"cell": f"{model} {hosts}h {rate}", "fit" if d.name in FIT else "held out": d.name,
                      **{f"{x:g} ms": v for x, v in line.items()}}))
print("cells meeting [median, worst, Spearman, pick] of", len(CELLS),
      json.dumps({f"{x:g} ms": g for x, g in goals.items()}))
print("of the", sum(d.name not in FIT for d, _ in loaded.values()), "held out",
      json.dumps({f"{x:g} ms": g for x, g in held_out.items()}))
