"""Shape b priced in an experiment beside the estimate, judged again on today's cost model: saved cells priced twice
on one profile per (folder, model, hosts), once as the estimate prices and once with a flushed pipeline's fill and
drain priced at the CFS budget a host has after idling. Each stage's first micro-batch, forward and backward, is a
burst of w seconds of a core, which takes min(w, q) + max(0, w - q) / speed with q = 10 ms x the host's quota (2 cores
/ hosts, as the bench's hosts have): bench/local-probes/burst-2026-12-01, where it was judged on 2026-12-01 against
the cost model of then. Cells run before the probe held a job's mesh are priced at the held mesh's latencies
(probes.jsonl), as reprice_groups.py prices them. Not a change to the estimate: tessel.planner.estimate.pipeline is
replaced for the second pricing only.

    python bench/plan-probe-groups/reprice_budget.py --profiles /tmp/pg.pkl bench/plan-mesh-4h-200 ... > budget.txt
"""
import argparse
import pickle
import sys
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.planner import choose
from tessel.planner import estimate as est
from tessel.resolve import job_of, settings_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for what the re-pricing scripts share
sys.path.insert(0, str(Path(__file__).resolve().parent))
from held import goals, held_latencies, summary, topology  # noqa: E402
from reprice_common import measured_rows, plan_of, score  # noqa: E402

PERIOD = 0.010
plain = est.pipeline
now = {}


def budgeted(plan, compute, forward, work, send, hops):
    """span.pipeline with each stage's first micro-batch (the fill and drain) computed as two bursts after idling."""
    if not (plan.pp > 1 and plan.schedule.flushed):
        return plain(plan, compute, forward, work, send, hops)
    comm, bubble = plain(plan, compute, forward, work, send, hops)
    f, q = now["speed"], now["budget"]

    def burst(cpu):  # seconds of a burst of ``cpu`` core-seconds run by a host that has idled
        return min(cpu, q) + max(0.0, cpu - q) / f
    saved = sum(c - burst(fw * f) - burst((c - fw) * f) for c, fw in zip(compute, forward))
    return comm, max(0.0, bubble - saved)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--profiles", required=True)
    args = ap.parse_args()
    held = held_latencies()
    cache = Path(args.profiles)
    profiles = {k: pickle.loads(v) for k, v in pickle.loads(cache.read_bytes()).items()} if cache.exists() else {}
    met = {"as priced": [0] * 5, "with the budget": [0] * 5}
    ncells = 0
    for name in args.folders:
        folder, cells = Path(name), {}
        for r in measured_rows(folder):
            cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
            topo = topology(r, None if folder.name.startswith("plan-mesh") else held[(r["hosts"], r["rate"])])
            key = f"{folder.name}/{r['model']}/{r['hosts']}"
            if key not in profiles:
                profiles[key] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
            profiles[key].job = job_of(cfg)
            plan = plan_of(folder, r, cfg)
            before = est.estimate(plan, settings_of(cfg), profiles[key], topo).step
            now.update(speed=topo.speed, budget=PERIOD * 2 / r["hosts"])
            est.pipeline = budgeted
            try:
                after = est.estimate(plan, settings_of(cfg), profiles[key], topo).step
            finally:
                est.pipeline = plain
            cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r, before, after))
        for cell, rows in cells.items():
            ncells += 1
            print(f"{name} {cell}:", flush=True)
            for k, label in ((1, "as priced"), (2, "with the budget")):
                rs = [{**r, "predicted": g[k - 1]} for r, *g in rows]
                print(f"  {label:16s}{score(rs)}")
                met[label] = [m + ok for m, ok in zip(met[label], goals(rs))]
            for r, b, a in rows:
                print(f"    {r['plan']}: {b * 1e3:.0f} -> {a * 1e3:.0f} ms, measured {r['measured'] * 1e3:.0f}")
    for label, n in met.items():
        print(summary(label, n, ncells))
    for p in profiles.values():
        p.job, p._shards = None, {k: v for k, v in p._shards.items() if k[0] == "timed"}
    cache.write_bytes(pickle.dumps({k: pickle.dumps(p) for k, p in profiles.items()}))


main()
