"""Each saved cell's candidates priced twice on one fresh profile per (model, hosts): every ring step at the probe's
loaded latency (before; Topology.sync empty), and each call at what the probe measured a call to cost after the compute
before it (now; the cell's saved probe's ``sync``). The measurements are the runs'; only the prices change. Per cell:
median and worst error, Spearman, and the pick (the cheapest-priced candidate of those run) judged by its paired
interval over the best measured, as `tessel bench plan` judges it.

Needs the code of commit ef0bcf8, where Topology has ``sync``; the next commit took that pricing out again, as this
re-pricing found it worse (output: reprice_sync.txt; docs/benchmarks.md, "The wait as a function of the compute before
a call"). Run right after the cells' runs (the profile is taken afresh, so a later rerun moves with the machine):
    git worktree add /tmp/ef0 ef0bcf8
    PYTHONPATH=/tmp/ef0/src python bench/plan-sync/reprice_sync.py bench/plan-sync-8h-1g"""
import dataclasses
import sys
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.planner import choose
from tessel.planner.estimate import estimate
from tessel.planner.topology import Topology, sync_points
from tessel.resolve import job_of, settings_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for what the re-pricing scripts share
from reprice_common import measured_rows, plan_of, score  # noqa: E402

profiles = {}


def priced(r, folder):
    cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
    probe = r.get("probe") or {}
    now = Topology(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6, latency=r["latency"],
                   speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"], per_micro=r.get("per_micro", 0.0),
                   sync=sync_points(probe), source="saved")
    before = dataclasses.replace(now, sync=())
    key = (r["model"], r["hosts"])
    if key not in profiles:
        profiles[key] = choose(job_of(cfg), before, cfg.plan.allow_async).profile
    plan = plan_of(folder, r, cfg)
    return [estimate(plan, settings_of(cfg), profiles[key], t) for t in (before, now)]


for name in sys.argv[1:]:
    folder = Path(name)
    rows = measured_rows(folder)
    cells = {}
    for r in rows:
        b, n = priced(r, folder)
        cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r, b, n))
    for cell, got in cells.items():
        before = [{**r, "predicted": b.step} for r, b, _ in got]
        now = [{**r, "predicted": n.step} for r, _, n in got]
        print(f"{name} {cell}:\n  before {score(before)}\n  now    {score(now)}", flush=True)
        for r, b, n in got:
            print(f"    {r['plan']}: {b.step * 1e3:.0f} -> {n.step * 1e3:.0f} ms (comm {b.comm * 1e3:.0f} -> "
                  f"{n.comm * 1e3:.0f}), measured {r['measured'] * 1e3:.0f}, at the run {r['predicted'] * 1e3:.0f}")
