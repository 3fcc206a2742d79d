"""Every cell's latest saved run priced twice on one fresh profile per (model, hosts): each collective's ring steps
at the probe's loaded figure (before), and a wait per call plus each ring step at the idle figure, both from the
cell's own saved probe (now; Topology.call). The runs' measurements are the saved ones; only the prices change.
Per cell: median and worst error, Spearman, and the pick (the cheapest-priced candidate of those run) judged by
its paired interval over the best measured, as `tessel bench plan` judges it.

Needs the code of commit d91cb76, where Topology has the wait (idle_latency, Topology.call); the next commit took
that pricing out again, as this re-pricing found it worse (docs/benchmarks.md, "A wait per call, priced flat").
Run: git worktree add /tmp/d91 d91cb76 && PYTHONPATH=/tmp/d91/src python bench/plan-wait/reprice_wait.py \
    bench/plan bench/plan-lstm-again ...   (the folders in reprice_wait.txt, in its order)
The profile is taken afresh by each run, so a rerun's figures move with it (shape d): run alone on
bench/plan-unseen-5h-150-cls, the cell came out 26%, +86%, 0.00 before and 48%, +105%, 0.52 with the wait, against
25%, +86%, 0.38 and 38%, +104%, 0.52 in reprice_wait.txt."""
import dataclasses
import sys
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.planner import choose
from tessel.planner.estimate import estimate
from tessel.planner.topology import Topology
from tessel.resolve import job_of, settings_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for what the re-pricing scripts share
from reprice_common import measured_rows, plan_of, score  # noqa: E402

profiles = {}


def priced(r, folder):
    cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
    now = Topology(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6, latency=r["latency"],
                   idle_latency=(r.get("probe") or {}).get("idle_latency", 0.0), speed=r["speed"],
                   rate_mbit=r["rate_mbit"], overlap=r["overlap"], per_micro=r.get("per_micro", 0.0), source="saved")
    before = dataclasses.replace(now, idle_latency=0.0)
    key = (r["model"], r["hosts"])
    if key not in profiles:
        profiles[key] = choose(job_of(cfg), before, cfg.plan.allow_async).profile
    plan = plan_of(folder, r, cfg)
    return [estimate(plan, settings_of(cfg), profiles[key], t).step for t in (before, now)], now.wait


for name in sys.argv[1:]:
    folder = Path(name)
    rows = measured_rows(folder)
    cells = {}
    for r in rows:
        (b, n), wait = priced(r, folder)
        cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r, b, n, wait))
    for cell, got in cells.items():
        before = [{**r, "predicted": b} for r, b, _, _ in got]
        now = [{**r, "predicted": n} for r, _, n, _ in got]
        print(f"{name} {cell} (wait {got[0][3] * 1e3:.1f} ms a call):\n  before {score(before)}\n  now    {score(now)}",
              flush=True)
        for r, b, n, _ in got:
            print(f"    {r['plan']}: {b * 1e3:.0f} -> {n * 1e3:.0f} ms, measured {r['measured'] * 1e3:.0f}")
