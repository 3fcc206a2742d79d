"""Saved cells' candidates priced on one profile per (model, hosts) by the code this runs under: the code before
2026-12-07's change (every ring step at the probe's loaded one-element latency, a call's bytes and steps added), or
after it (a 4 KiB all-reduce's loaded ring step, the longer of bytes and steps: Topology.call_seconds). The profiles,
with their layers' tensor-parallel timings, are pickled to --profiles by the first run and read by the second, so both
price on the same ones. A cell whose saved
probe has no ``tiny_latency`` (run before the change) takes the 4 KiB latency from --probe FILE (a probe of a cluster
like the cell's, run later). Per cell: median and worst error, Spearman, and the pick judged by its paired interval,
as `tessel bench plan` judges it.

    git worktree add /tmp/before 5a03f02
    PYTHONPATH=/tmp/before/src python bench/plan-latency/reprice_latency.py --profiles /tmp/p.pkl \
        bench/plan-sync-8h-1g --probe bench/plan-latency/probe-8h-1g.json > before.txt
    python bench/plan-latency/reprice_latency.py --profiles /tmp/p.pkl ... > after.txt"""
import argparse
import json
import os
import pickle
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

NEW = hasattr(Topology, "call_seconds")


def topology(r, extra):
    probe = r.get("probe") or {}
    if "tiny_latency" not in probe:  # a run before the change: its latency was the one-element one
        probe = {**probe, "tiny_latency": r["latency"], "latency": extra.get("latency", r["latency"])}
    own = {k: r.get(k, 0.0) for k in ("speed", "rate_mbit", "overlap", "per_micro")}
    if r.get("calibrated"):  # the row holds the trial's rates and the probe's beside them: the probe's, its speed
        # capped at the host's CPU budget (the plan check's default: this machine's cores over the hosts)
        own = {"speed": min(probe["speed"], (os.cpu_count() or 1) / r["hosts"]), "rate_mbit": probe["mbit"],
               "overlap": probe["overlap"], "per_micro": 0.0}
    base = dict(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6, source="saved", **own)
    if NEW:
        return Topology(latency=probe["latency"], tiny_latency=probe["tiny_latency"], **base)
    return Topology(latency=probe["tiny_latency"], **base)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--profiles", required=True)
    ap.add_argument("--probe", action="append", default=[], help="a later probe's JSON for cells run before the change")
    args = ap.parse_args()
    extra = {}
    for f in args.probe:
        d = json.loads(Path(f).read_text())
        extra[(d["ranks"], d.get("rate"))] = d
    cache = Path(args.profiles)
    profiles = {k: pickle.loads(v) for k, v in pickle.loads(cache.read_bytes()).items()} if cache.exists() else {}
    print(f"priced by the code {'after' if NEW else 'before'} the change")
    for name in args.folders:
        folder = Path(name)
        rows = measured_rows(folder)
        cells = {}
        for r in rows:
            cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
            topo = topology(r, extra.get((r["hosts"], r["rate"]), {}))
            key = f"{folder.name}/{r['model']}/{r['hosts']}"
            if key not in profiles:
                profiles[key] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
            profiles[key].job = job_of(cfg)
            plan = plan_of(folder, r, cfg)
            e = estimate(plan, settings_of(cfg), profiles[key], topo)
            cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append(({**r, "predicted": e.step}, e))
        for cell, got in cells.items():
            print(f"{name} {cell}: {score([r for r, _ in got])}", flush=True)
            for r, e in got:
                print(f"    {r['plan']}: {e.step * 1e3:.0f} ms (compute {e.compute * 1e3:.0f}, comm "
                      f"{e.comm * 1e3:.0f}, bubble {e.bubble * 1e3:.0f}), measured {r['measured'] * 1e3:.0f}")
    if not cache.exists():  # each profile without its job (whose model a closure builds) and with only the layers'
        # tensor-parallel timings of its caches (timed lazily on stand-in groups, so the second run prices on them too)
        for p in profiles.values():
            p.job, p._shards = None, {k: v for k, v in p._shards.items() if k[0] == "timed"}
        cache.write_bytes(pickle.dumps({k: pickle.dumps(p) for k, p in profiles.items()}))


main()
