"""Saved cells priced by the estimate of commit 631c590 (the probe's wait, quota, FSDP rates and the link's burst, the
recompute share by size, the runtime's cost per micro-batch) two ways on one profile per (folder, model, hosts): as
it prices, and with FSDP's gathers and reduce-scatters charged no wait after compute (the ``cpu`` their waits
follow, passed to ``estimate._sharded_sync``, set to 0). The link's burst is the cell's own probe's where it measured
one, else bench/plan-burst/probes.jsonl's. Run it with 631c590's package first on the path:

    git worktree add /tmp/wt-631c590 631c590
    PYTHONPATH=/tmp/wt-631c590/src python bench/plan-fsdp-wait/reprice.py --profiles /tmp/pg-burst.pkl \
        bench/plan-latency-4h-200 bench/plan-tail-4h-1g bench/plan-tail-6h-200 bench/plan-tail-8h-1g \
        bench/plan-tail-8h-200 bench/plan-mesh-4h-200 bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g \
        bench/plan-mesh-8h-200 bench/plan-wait-8h-500 bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 \
        bench/plan-micro-4h-300 > bench/plan-fsdp-wait/reprice.txt
    (and with bench/plan-burst-6h-300 alone > bench/plan-fsdp-wait/reprice-6h-300.txt)
"""
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

for sub in ("", "plan-probe-groups", "plan-wait", "plan-burst"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / sub))
from held import price, report, save_profiles, summary  # noqa: E402
from reprice_burst import bursts  # noqa: E402
from reprice_probed import probed_ways, setup  # noqa: E402

from tessel.planner import estimate as est  # noqa: E402

WAYS = ("as priced", "FSDP's calls without a wait")
as_priced = est._sharded_sync


def no_wait(plan, params, units, gathered, elem, topo, stride, cpu):
    return as_priced(plan, params, units, gathered, elem, topo, stride, 0.0)


def main():
    args, points, latencies, profiles = setup()
    burst = bursts()
    met, ncells, fsdp = {w: [0] * 5 for w in WAYS}, 0, []

    def today(r, topo):
        probed = probed_ways(r, topo, points)
        own = (r.get("probe") or {}).get("link_burst", burst.get((r["hosts"], r["rate"])))
        return None if not probed or own is None else [replace(probed[-1], link_burst=own)]
    for name in args.folders:
        before = price(Path(name), profiles, today, latencies)
        est._sharded_sync = no_wait
        after = price(Path(name), profiles, today, latencies)
        est._sharded_sync = as_priced
        cells = {k: [(r, [a[0], b[0]]) for (r, a), (_, b) in zip(before[k], after[k])] for k in before}
        ncells += report(name, cells, WAYS, met)
        fsdp += [[(g - r["measured"]) / r["measured"] for g in got] for rows in cells.values() for r, got in rows
                 if re.search(r"fsdp\d", r["plan"])]
    for way, n in met.items():
        print(summary(way, n, ncells))
    for k, way in enumerate(WAYS):
        print(f"{way}: the {len(fsdp)} FSDP candidates' median error {statistics.median(e[k] for e in fsdp):+.1%}, "
              f"median absolute {statistics.median(abs(e[k]) for e in fsdp):.1%}")
    save_profiles(Path(args.profiles), profiles)


if __name__ == "__main__":
    main()
