# re-price the saved runs with the probe, as the planner does and under a quota model (a pipeline step the longer of
# its schedule at a full core and its busiest stage at the quota): python bench/plan-trial-3/quota.py bench/plan-trial-3
import json, statistics, sys, re
from dataclasses import replace
from pathlib import Path
from tessel.bench import plan_check as pc
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import choose
from tessel.planner.estimate import estimate
from tessel.planner.topology import Topology
from tessel.resolve import job_of, policy_of, settings_of
out = Path(sys.argv[1])
rows = json.loads((out / "results.json").read_text())["rows"]
probes = json.loads((out / "probes.json").read_text()) if (out / "probes.json").exists() else None
profiles, res = {}, []
for r in rows:
    if r["measured"] is None: continue
    cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
    h = r["hosts"]
    if probes:
        p = probes[f"{h}-{r['rate']}"]
        topo = Topology(ranks=h, hosts=h, link_mbit=parse_rate(r["rate"]) / 1e6, latency=p["latency"], speed=min(1.0, 2 / h, p["speed"]), rate_mbit=p["mbit"], overlap=p["overlap"])
    else:
        topo = Topology(ranks=h, hosts=h, link_mbit=parse_rate(r["rate"]) / 1e6, latency=r["latency"], speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"])
    if r["model"] not in profiles:
        profiles[r["model"]] = choose(job_of(cfg), topo, False).profile
    prof = profiles[r["model"]]
    plan = ParallelPlan.from_json((out / "plans" / f"{r['model']}-h{h}-{r['rate']}" / f"{r['plan'].replace(' ', '-')}.json").read_text()).with_(sparse=policy_of(cfg))
    eq = estimate(plan, settings_of(cfg), prof, topo)
    e1 = estimate(plan, settings_of(cfg), prof, replace(topo, speed=1.0))
    new = max(e1.step, eq.compute + eq.comm) if plan.pp > 1 else eq.step
    res.append((r["model"], h, r["rate"], r["plan"], r["measured"], eq.step, new))
cells = {}
for x in res:
    cells.setdefault(x[:3], []).append(x)
    print(f"{x[0]:14s} h{x[1]} {x[2]:7s} {x[3]:44s} meas {x[4]*1e3:6.0f} now {x[5]*1e3:6.0f} ({(x[5]-x[4])/x[4]:+.0%}) quota {x[6]*1e3:6.0f} ({(x[6]-x[4])/x[4]:+.0%})")
alln, allq = [], []
for k, xs in cells.items():
    en = [abs(x[5]-x[4])/x[4] for x in xs]; eq_ = [abs(x[6]-x[4])/x[4] for x in xs]; alln += en; allq += eq_
    print(k, f"now {statistics.median(en):.0%}/{max(en):.0%}  quota {statistics.median(eq_):.0%}/{max(eq_):.0%}")
print("all", f"now {statistics.median(alln):.0%}/{max(alln):.0%}  quota {statistics.median(allq):.0%}/{max(allq):.0%}")
