"""Rebuild bench/plan-trial-8/results.json from the interrupted run's cell folders, its log and a fresh profile."""
import ast, json, re, statistics
from pathlib import Path
from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import choose, short
from tessel.planner.estimate import estimate
from tessel.planner.topology import Topology
from tessel.resolve import job_of, policy_of, settings_of
from tessel.cluster.emulate import parse_rate
from dataclasses import replace

out = Path(__file__).resolve().parent
log = (out / "run.log").read_text().splitlines()
probes, cals, order = {}, [], []
rate = None
for ln in log:
    m = re.match(r"probe, (\d+) hosts, (\w+): (\{.*\})", ln)
    if m:
        rate = (int(m[1]), m[2]); probes[rate] = ast.literal_eval(m[3])
    m = re.search(r"calibration trial ([\d.]+) s .* compute ([\d.]+)x the profile's core, ([\d.]+) ms per extra micro-batch, latency (\d+) us per ring step, a rank moves (\d+) Mbit/s, (\d+)% of", ln)
    if m:
        cals.append((rate, float(m[1]), float(m[2]), float(m[3]) / 1e3, float(m[4]) * 1e-6, float(m[5]), float(m[6]) / 100))
models = ["classifier", "lstm_lm"]
cells = []
for (h, r) in probes:
    for m in models:
        cells.append((m, h, r))
rows = []
profiles = {}
import sys
saved = json.loads((out / "results.json").read_text())["rows"] if (out / "results.json").is_file() else []
done = {(x["model"], x["hosts"], x["rate"]) for x in saved}
cells = [c for c in cells if c not in done]
for (m, h, r), cal in zip(cells, cals):
    assert cal[0] == (h, r)
    cfg = load_config(None, [*pc.MODELS[m], *pc.COMMON])
    p = probes[(h, r)]
    cpus = 2 / h
    probed = Topology(ranks=h, hosts=h, link_mbit=parse_rate(r) / 1e6, latency=p["latency"], speed=min(1.0, cpus, p["speed"]),
                      rate_mbit=p["mbit"], overlap=p["overlap"], source="probe")
    caltopo = replace(probed, speed=cal[2], per_micro=cal[3], latency=cal[4], rate_mbit=cal[5], overlap=cal[6])
    if m not in profiles:
        profiles[m] = choose(job_of(cfg), probed, False).profile
    prof = profiles[m]
    cell_out = out / f"{m}-h{h}-{r}"
    ests = []
    for f in sorted((out / "plans" / f"{m}-h{h}-{r}").glob("*.json")):
        plan = ParallelPlan.from_json(f.read_text()).with_(sparse=policy_of(cfg))
        ests.append((estimate(plan, settings_of(cfg), prof, caltopo), estimate(plan, settings_of(cfg), prof, probed), f.stem))
    ests.sort(key=lambda t: t[0].step)
    for rank, (e, ep, label) in enumerate(ests, 1):
        runs = []
        for d in sorted((cell_out / "runs").glob(f"{m}-{label}-h{h}-{r}-r*")):
            s = d / "summary.json"
            if s.is_file():
                runs.append({"step_time": json.loads(s.read_text())["median_step_time"], "repeat": int(d.name.rsplit("-r", 1)[1])})
        row = pc._row(m, h, r, rank, e, runs, cell_out, label, 0.0)
        row.update(latency=caltopo.latency, speed=caltopo.speed, rate_mbit=caltopo.rate_mbit, overlap=caltopo.overlap,
                   per_micro=caltopo.per_micro, calibrated=True, trial_s=cal[1], predicted_probe=ep.step,
                   predicted_at_run=None)
        rows.append(row)
cmd = ("tessel bench plan --models classifier,lstm_lm --hosts 8 --rates 1gbit --repeats 3 --steps 8 --trial --out "
       "bench/plan-trial-8 (stopped by its 45-minute timeout in the second cell; the classifier's rows as the bench saved "
       "them, its trial failed; the LSTM's rebuilt from its cell folder, the logged probe and trial, one fresh profile)")
rows = [x for x in saved] + rows
(out / "results.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=1))
print(pc.markdown(rows, cmd))
