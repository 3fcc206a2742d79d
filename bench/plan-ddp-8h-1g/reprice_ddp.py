"""Each saved cell's candidates priced on one profile per model: DDP's latency once (before) and per bucket (now)."""
import json, statistics, sys
from pathlib import Path
from tessel.bench import plan_check as pc
from tessel.planner import estimate as E
from tessel.planner.topology import Topology
from tessel.cluster.emulate import parse_rate
from tessel.plan import ParallelPlan
from tessel.config import load_config
from tessel.resolve import job_of, policy_of, settings_of
from tessel.planner import choose

def spearman(a, b):
    import scipy.stats
    return scipy.stats.spearmanr(a, b).statistic

profiles = {}
real = E._ddp_buckets
for folder in sys.argv[1:]:
    out = Path(folder)
    rows = json.loads((out / "results.json").read_text())["rows"]
    cells = {}
    for r in rows:
        if r.get("measured") is None: continue
        cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
        topo = Topology(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6, latency=r["latency"],
                        speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"], per_micro=r.get("per_micro", 0.0), source="saved")
        key = (r["model"], r["hosts"], str(out))
        if key not in profiles:
            profiles[key] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
        label = r["plan"].replace(" ", "-")
        plan = ParallelPlan.from_json((out / "plans" / f"{r['model']}-h{r['hosts']}-{r['rate']}" / f"{label}.json").read_text())
        plan = plan.with_(sparse=policy_of(cfg))
        E._ddp_buckets = lambda *a: 1
        before = E.estimate(plan, settings_of(cfg), profiles[key], topo).step
        E._ddp_buckets = real
        now = E.estimate(plan, settings_of(cfg), profiles[key], topo).step
        cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r["plan"], before, now, r["measured"], r.get("predicted_at_run", r["predicted"]), r.get("predicted_at_run", r["predicted"]) + now - before))
    for cell, c in cells.items():
        def score(i):
            errs = [(x[i] - x[3]) / x[3] for x in c]
            pick = min(c, key=lambda x: x[i])
            best = min(c, key=lambda x: x[3])
            return statistics.median(abs(e) for e in errs), max(errs, key=abs), spearman([x[i] for x in c], [x[3] for x in c]), pick[0], pick[3] / best[3]
        b, n, ar, an = score(1), score(2), score(4), score(5)
        print(f"{folder} {cell}: before med {b[0]:.0%} worst {b[1]:+.0%} rho {b[2]:.2f} pick {b[3]} {b[4]:.2f}x | now med {n[0]:.0%} worst {n[1]:+.0%} rho {n[2]:.2f} pick {n[3]} {n[4]:.2f}x", flush=True)
        print(f"   as run: med {ar[0]:.0%} worst {ar[1]:+.0%} rho {ar[2]:.2f} pick {ar[4]:.2f}x | as run + delta: med {an[0]:.0%} worst {an[1]:+.0%} rho {an[2]:.2f} pick {an[3]} {an[4]:.2f}x")
        for x in c:
            if abs(x[1] - x[2]) > 1e-4:
                print(f"     {x[0]}: {x[1]*1e3:.0f} -> {x[2]*1e3:.0f} ms, measured {x[3]*1e3:.0f}")
