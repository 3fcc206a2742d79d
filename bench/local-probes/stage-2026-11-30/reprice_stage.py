"""The saved 3-round planner cells priced twice by the same fresh profile: without and with Topology.stage_micro
(CPU_STAGE_MICRO); per cell the median and worst error and Spearman, before -> after."""
import json, statistics, sys
from pathlib import Path

from cells import CELLS
from dataclasses import replace
from scipy.stats import spearmanr
from tessel.bench.plan_check import MODELS, COMMON, _saved, policy_of
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import Topology
from tessel.planner.choose import choose
from tessel.planner.estimate import estimate
from tessel.planner.topology import CPU_STAGE_MICRO
from tessel.resolve import job_of, settings_of

profiles, out = {}, []
for (model, hosts, rate), folder in CELLS.items():
    d = Path("/work/main/bench") / folder
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate
            and r.get("measured")]
    cfg = load_config(None, [*MODELS[model], *COMMON])
    res = {"before": [], "after": []}
    for r in rows:
        topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                        speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"],
                        per_micro=r.get("per_micro", 0.0))
        if model not in profiles:
            profiles[model] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
        plan = ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" / f"{r['plan'].replace(' ', '-')}.json").read_text())
        plan = plan.with_(sparse=policy_of(cfg))
        for k, t in (("before", topo), ("after", replace(topo, stage_micro=CPU_STAGE_MICRO))):
            res[k].append(estimate(plan, settings_of(cfg), profiles[model], t).step)
    meas = [r["measured"] for r in rows]
    line = {"cell": f"{model} {hosts}h {rate}", "n": len(rows)}
    for k in ("before", "after"):
        err = [p / m - 1 for p, m in zip(res[k], meas)]
        worst = max(err, key=abs)
        line[k] = (round(100 * statistics.median(map(abs, err))), round(100 * worst), round(spearmanr(res[k], meas)[0], 2))
    out.append(line); print(json.dumps(line), flush=True)
