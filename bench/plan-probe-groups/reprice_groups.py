"""Saved cells' candidates priced twice on one profile per (folder, model, hosts) by the code this runs under: at the
cell's own probe (timed in a process holding only the world's group, as every probe before 2026-12-07 10:40 UTC was),
and with that probe's two latencies replaced by those of a probe that holds a data-parallel job's mesh (``probes.jsonl``
from groups.py, one line per hosts and rate). Speed, rate and overlap stay the cell's own. Per cell: median and worst
error, Spearman, and the pick judged by its paired interval, as `tessel bench plan` judges it.

    python bench/plan-probe-groups/reprice_groups.py --profiles /tmp/pg.pkl bench/plan-latency-8h-1g ... > reprice.txt
"""
import argparse
import pickle
import sys
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.planner import choose
from tessel.planner.estimate import estimate
from tessel.resolve import job_of, settings_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for what the re-pricing scripts share
from reprice_common import measured_rows, plan_of, score  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from held import goals, held_latencies, summary, topology  # noqa: E402

HERE = Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--profiles", required=True)
    args = ap.parse_args()
    held = held_latencies()
    ncells = 0
    met = {"own probe": [0, 0, 0, 0, 0], "mesh held": [0, 0, 0, 0, 0]}  # median, worst, Spearman, within, misses
    cache = Path(args.profiles)
    profiles = {k: pickle.loads(v) for k, v in pickle.loads(cache.read_bytes()).items()} if cache.exists() else {}
    for name in args.folders:
        folder, cells = Path(name), {}
        for r in measured_rows(folder):
            cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
            key = f"{folder.name}/{r['model']}/{r['hosts']}"
            if key not in profiles:
                profiles[key] = choose(job_of(cfg), topology(r, None), cfg.plan.allow_async).profile
            profiles[key].job = job_of(cfg)
            plan = plan_of(folder, r, cfg)
            got = [estimate(plan, settings_of(cfg), profiles[key], topology(r, lat)).step
                   for lat in (None, held[(r["hosts"], r["rate"])])]
            cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r, got))
        for cell, rows in cells.items():
            ncells += 1
            before = score([{**r, "predicted": g[0]} for r, g in rows])
            after = score([{**r, "predicted": g[1]} for r, g in rows])
            print(f"{name} {cell}:\n  own probe   {before}\n  mesh held   {after}", flush=True)
            for label, rs in (("own probe", [{**r, "predicted": g[0]} for r, g in rows]),
                              ("mesh held", [{**r, "predicted": g[1]} for r, g in rows])):
                met[label] = [m + ok for m, ok in zip(met[label], goals(rs))]
            for r, (b, a) in rows:
                print(f"    {r['plan']}: {b * 1e3:.0f} -> {a * 1e3:.0f} ms, measured {r['measured'] * 1e3:.0f}")
    for label, n in met.items():
        print(summary(label, n, ncells))
    for p in profiles.values():  # (as reprice_latency.py stores them: no job, only the timed tp caches)
        p.job, p._shards = None, {k: v for k, v in p._shards.items() if k[0] == "timed"}
    cache.write_bytes(pickle.dumps({k: pickle.dumps(p) for k, p in profiles.items()}))


main()
