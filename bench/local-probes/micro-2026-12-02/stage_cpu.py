"""Each saved pipeline candidate's CPU a step per stage (the run's summary, process time of every rank) against
its layers' price at speed 1 (one fresh profile): what a stage spends per micro-batch beyond its layers, by plan.
Usage: python stage_cpu.py FOLDER MODEL HOSTS RATE"""
import glob
import json
import statistics
import sys
from pathlib import Path

from cell import load

from tessel.planner.estimate import _layer_seconds

folder, model, hosts, rate = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
cfg, rows, plans, profile = load(folder, model, hosts, rate)
b = cfg.train.global_batch
print("step_factor", round(profile.step_factor, 3))
for name, plan in plans.items():
    if plan.pp == 1:
        continue
    m = plan.micro_batches
    samples = b / (plan.dp * m)
    layer = [t * profile.step_factor for t in _layer_seconds(plan, profile, samples)]
    again = 1 + (0.33 if plan.recompute.layers else 0.0)  # (rough: a recompute's forward again)
    priced = [sum(layer[lo:hi]) * again * m for lo, hi in plan.bounds]
    runs = sorted(glob.glob(str(folder / f"{model}-h{hosts}-{rate}" / "runs" /
                                f"{model}-{name.replace(' ', '-')}-h{hosts}-{rate}-r*" / "summary.json")))
    cpu = []
    for f in runs:
        p = json.load(open(f))["pipeline"]
        stage = p["stage_of_rank"]
        cpu.append([statistics.median(c for c, s in zip(p["cpu_per_step_per_rank"], stage) if s == k)
                    for k in range(plan.pp)])
    med = [statistics.median(c[k] for c in cpu) for k in range(plan.pp)]
    beyond = [(c - p) / m * 1e3 for c, p in zip(med, priced)]
    print(f"{name:45s} m{m} priced cpu/stage {[round(x * 1e3, 1) for x in priced]} "
          f"ran {[round(x * 1e3, 1) for x in med]}"
          f" beyond per micro-batch (ms) {[round(x, 2) for x in beyond]}")
