"""GPipe's two phases priced (each paced by its own slowest stage, from each layer's timed forward share) against the
planner before it (commit b47ec64: GPipe priced as 1F1B), on the 17 saved 3-round planner cells, both on one fresh
profile per model (so the difference is the change, not a profile's drift). Per cell before -> after: [median |error| %,
worst %, Spearman, the pick's measured time over the best's]; then every GPipe candidate whose 1F1B twin (same plan
otherwise) ran in the same rounds: predicted and measured GPipe over 1F1B."""
import json
import statistics
import sys
from pathlib import Path

from scipy.stats import spearmanr

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "stage-2026-11-30"))
sys.path.insert(0, str(HERE.parents[2] / "plan"))
from cells import CELLS  # noqa: E402
from paired_reprice import at_revision  # noqa: E402

from tessel.bench.plan_check import COMMON, MODELS, _saved  # noqa: E402
from tessel.cluster.emulate import parse_rate  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402
from tessel.planner import Topology  # noqa: E402
from tessel.planner.estimate import estimate  # noqa: E402
from tessel.planner.profile import measure  # noqa: E402
from tessel.resolve import job_of, policy_of, settings_of  # noqa: E402

CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")}}
BENCH = HERE.parents[2]
before_of = at_revision(sys.argv[1] if len(sys.argv) > 1 else "b47ec64")
loaded = {}
for (model, hosts, rate), folder in CELLS.items():
    d = BENCH / folder
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate
            and r.get("measured")]
    loaded[(model, hosts, rate)] = (d, rows)
profiles = {}
for model in MODELS:
    cfg = load_config(None, [*MODELS[model], *COMMON])
    plans = [ParallelPlan.from_json((d / "plans" / f"{m}-h{h}-{rt}" / f"{r['plan'].replace(' ', '-')}.json")
                                    .read_text()) for (m, h, rt), (d, rows) in loaded.items() if m == model
             for r in rows]
    b = cfg.train.global_batch
    profiles[model] = measure(job_of(cfg), sizes=tuple(sorted({b // (p.dp * p.micro_batches) for p in plans})),
                              dps=tuple(sorted({p.dp for p in plans})))
    print(model, "forward shares", [round(layer.forward_share, 2) for layer in profiles[model].layers])


def stats(pred, meas, names):
    err = [p / m - 1 for p, m in zip(pred, meas)]
    pick = min(range(len(pred)), key=pred.__getitem__)
    return [round(100 * statistics.median(map(abs, err))), round(100 * max(err, key=abs)),
            round(float(spearmanr(pred, meas)[0]), 2), round(meas[pick] / min(meas), 2), names[pick]]


goals = {"before": [0, 0, 0, 0], "after": [0, 0, 0, 0]}
pairs = []
for (model, hosts, rate), (d, rows) in loaded.items():
    cfg = load_config(None, [*MODELS[model], *COMMON])
    settings, profile = settings_of(cfg), profiles[model]
    got = {}
    for r in rows:
        topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                        speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"],
                        per_micro=r.get("per_micro", 0.0))
        plan = ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" / f"{r['plan'].replace(' ', '-')}.json")
                                      .read_text()).with_(sparse=policy_of(cfg))
        got[r["plan"]] = (r, before_of(plan, settings, profile, topo), estimate(plan, settings, profile, topo).step)
    names = list(got)
    meas = [got[n][0]["measured"] for n in names]
    res = {}
    for k, label in ((1, "before"), (2, "after")):
        res[label] = stats([got[n][k] for n in names], meas, names)
        med, worst, rho, pick, _ = res[label]
        goals[label] = [a + b for a, b in zip(goals[label], (med <= 10, abs(worst) <= 30, rho >= 0.8, pick <= 1.10))]
    print(json.dumps({"cell": f"{model} {hosts}h {rate}", **res}))
    for n in names:
        twin = n.replace(" gpipe ", " 1f1b ")
        if twin != n and twin in got:
            pairs.append((f"{model} {hosts}h {rate} {n}", got[n][2] / got[twin][2],
                          got[n][0]["measured"] / got[twin][0]["measured"]))
print("cells meeting [median <= 10%, worst <= 30%, Spearman >= 0.8, pick <= 1.10x by median] of", len(CELLS),
      json.dumps(goals))
print("GPipe over 1F1B, same plan otherwise (before: 1.00 by construction):")
for name, pred, meas in pairs:
    print(f"  {name:62s} predicted {pred:.2f} measured {meas:.2f}")
m_gt1 = [(p, q) for n, p, q in pairs if " m1" not in n.split("gpipe")[1][:3]]
print(f"m > 1: {len(m_gt1)} pairs; predicted median {statistics.median(p for p, _ in m_gt1):.2f}, measured median "
      f"{statistics.median(q for _, q in m_gt1):.2f}; predicted within 10% of measured in "
      f"{sum(abs(p / q - 1) <= 0.10 for p, q in m_gt1)} (before: {sum(abs(1 / q - 1) <= 0.10 for _, q in m_gt1)})")
