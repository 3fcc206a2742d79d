"""How reproducible the planner's prices are: the candidates of saved cells priced on N fresh profiles of each
model, one after another in one process (as the cells' topologies were probed), and per profile the pick and its
step_factor; per candidate the spread of its price (max over min). Usage: python repro.py N"""
import json
import statistics
import sys
import time
from pathlib import Path

from scipy.stats import spearmanr

from tessel.bench.plan_check import COMMON, MODELS, _saved
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import Topology
from tessel.planner.estimate import estimate
from tessel.planner.profile import measure
from tessel.resolve import job_of, policy_of, settings_of

BENCH = Path(__file__).resolve().parents[2]
CELLS = [("classifier", 6, "200mbit", "plan-unseen-6h-200"), ("transformer_lm", 6, "200mbit", "plan-unseen-6h-200"),
         ("lstm_lm", 2, "100mbit", "plan-unseen-2h-100")]
n = int(sys.argv[1])
for model, hosts, rate, folder in CELLS:
    d = BENCH / folder
    cfg = load_config(None, [*MODELS[model], *COMMON])
    settings, b = settings_of(cfg), cfg.train.global_batch
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate]
    plans = [ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" / f"{r['plan'].replace(' ', '-')}.json")
                                    .read_text()).with_(sparse=policy_of(cfg)) for r in rows]
    sizes = tuple(sorted({b // (p.dp * p.micro_batches) for p in plans}))
    dps = tuple(sorted({p.dp for p in plans}))
    prices, meta = [], []
    for i in range(n):
        t0 = time.perf_counter()
        prof = measure(job_of(cfg), sizes=sizes, dps=dps)
        got = []
        for r, plan in zip(rows, plans):
            topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                            speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"])
            got.append(estimate(plan, settings, prof, topo).step)
        prices.append(got)
        meas = [r["measured"] for r in rows]
        err = [p / m - 1 for p, m in zip(got, meas)]
        pick = min(range(len(got)), key=got.__getitem__)
        meta.append({"profile": i, "seconds": round(time.perf_counter() - t0, 1),
                     "step_factor": round(prof.step_factor, 3),
                     "pick": rows[pick]["plan"], "pick/best measured": round(meas[pick] / min(meas), 2),
                     "median |err| %": round(100 * statistics.median(map(abs, err))),
                     "worst %": round(100 * max(err, key=abs)), "spearman": round(float(spearmanr(got, meas)[0]), 2)})
        print(json.dumps({"cell": f"{model} {hosts}h {rate}", **meta[-1]}), flush=True)
    for j, r in enumerate(rows):
        ps = [p[j] for p in prices]
        print(f"  {r['plan']:44s} price {min(ps) * 1e3:6.1f}-{max(ps) * 1e3:6.1f} ms (x{max(ps) / min(ps):.2f}),"
              f" measured {r['measured'] * 1e3:6.1f}")
    rho = [spearmanr(prices[a], prices[c])[0] for a in range(n) for c in range(a + 1, n)]
    print(f"  profiles' rankings against each other: Spearman {min(rho):.2f}-{max(rho):.2f}; picks "
          f"{sorted({m['pick'] for m in meta})}", flush=True)
