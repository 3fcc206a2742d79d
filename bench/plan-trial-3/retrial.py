"""Run the calibration trial again on each cell of this folder's results.json (the emulated cluster of the cell),
fit it to a fresh profile and price the saved candidates with it, beside the saved measurements and the probe's
pricing. Writes retrial.json here: the cells' trial records and the rows priced again."""
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import calibrate, choose
from tessel.planner.estimate import estimate
from tessel.planner.topology import Topology
from tessel.resolve import job_of, policy_of, settings_of

out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
rows = json.loads((out / "results.json").read_text())["rows"]
cells = list(dict.fromkeys((r["model"], r["hosts"], r["rate"]) for r in rows))
profiles, trials, again = {}, {}, []
for model, h, rate in cells:
    cfg = load_config(None, [*pc.MODELS[model], *pc.COMMON])
    first = next(r for r in rows if (r["model"], r["hosts"], r["rate"]) == (model, h, rate))
    # the probe's topology as the run measured it (rows before 2026-11-27 22:00 UTC lack it: probes.json, from the log)
    probe = first.get("probe") or json.loads((out / "probes.json").read_text())[f"{h}-{rate}"]
    probed = Topology(ranks=h, hosts=h, link_mbit=parse_rate(rate) / 1e6, latency=probe["latency"],
                      speed=min(1.0, 2 / h, probe["speed"]), rate_mbit=probe["mbit"], overlap=probe["overlap"],
                      source="probe")
    trial = pc.trial_cell(model, h, rate, {"cpus": 2 / h})
    trials[f"{model}-h{h}-{rate}"] = trial
    if model not in profiles:
        profiles[model] = choose(job_of(cfg), probed, False).profile
    cal = calibrate.fit(trial, profiles[model])
    print(calibrate.describe(cal, h), flush=True)
    topo = cal.apply(probed)
    compute_only = replace(probed, speed=cal.speed, per_micro=cal.per_micro)  # the trial's compute, the probe's link
    for r in rows:
        if (r["model"], r["hosts"], r["rate"]) != (model, h, rate) or r["measured"] is None:
            continue
        path = out / "plans" / f"{model}-h{h}-{rate}" / f"{r['plan'].replace(' ', '-')}.json"
        plan = ParallelPlan.from_json(path.read_text()).with_(sparse=policy_of(cfg))
        e, p, c = (estimate(plan, settings_of(cfg), profiles[model], t) for t in (topo, probed, compute_only))
        again.append({"model": model, "hosts": h, "rate": rate, "plan": r["plan"], "measured": r["measured"],
                      "trial": e.step, "probe": p.step, "trial_compute": c.step, "at_run": r["predicted"]})
for cell in cells:
    rs = [a for a in again if (a["model"], a["hosts"], a["rate"]) == cell]
    for key in ("at_run", "trial", "probe", "trial_compute"):
        err = [abs(a[key] - a["measured"]) / a["measured"] for a in rs]
        print(cell, key, f"median {statistics.median(err):.0%} worst {max(err):.0%}")
(out / "retrial.json").write_text(json.dumps({"trials": trials, "rows": again}, indent=1))
