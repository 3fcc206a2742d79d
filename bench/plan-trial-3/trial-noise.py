import json, sys
from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.planner import calibrate, choose
from tessel.planner.topology import Topology
from tessel.resolve import job_of
out = {}
for model in ("transformer_lm", "classifier"):
    cfg = load_config(None, [*pc.MODELS[model], *pc.COMMON])
    prof = choose(job_of(cfg), Topology(ranks=4, hosts=4, link_mbit=1000, speed=0.5), False).profile
    for k in range(3):
        t = pc.trial_cell(model, 4, "1gbit", {"cpus": 0.5})
        cal = calibrate.fit(t, prof)
        out.setdefault(model, []).append({"trial": t, "speed": cal.speed, "latency": cal.latency, "per_micro": cal.per_micro})
        print(model, k, f"speed {cal.speed:.3f} latency {cal.latency*1e6:.0f} us per_micro {cal.per_micro*1e3:.2f} ms whole ms", [round(r["whole"]*1e3) for r in t["ranks"]], flush=True)
json.dump(out, open("bench/plan-trial-3/trial-noise.json", "w"), indent=1)
