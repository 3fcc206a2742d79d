"""Shape b priced in an experiment beside the estimate, judged again on today's cost model: saved cells priced twice
on one profile per (folder, model, hosts), once as the estimate prices and once with a flushed pipeline's fill and
drain priced at the CFS budget a host has after idling. Each stage's first micro-batch, forward and backward, is a
burst of w seconds of a core, which takes min(w, q) + max(0, w - q) / speed with q = 10 ms x the host's quota (2 cores
/ hosts, as the bench's hosts have): bench/local-probes/burst-2026-12-01, where it was judged on 2026-12-01 against
the cost model of then. Cells run before the probe held a job's mesh are priced at the held mesh's latencies
(probes.jsonl), as reprice_groups.py prices them. The second pricing is the estimate's own since the topology took
the host's quota (Topology.quota, Topology.after_idle); before, this script replaced span.pipeline for it.

    python bench/plan-probe-groups/reprice_budget.py --profiles /tmp/pg.pkl bench/plan-mesh-4h-200 ... > budget.txt
"""
import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for what the re-pricing scripts share
sys.path.insert(0, str(Path(__file__).resolve().parent))
from held import load_profiles, price, report, save_profiles, summary  # noqa: E402

PERIOD = 0.010  # the emulated hosts' CFS period (tessel cluster's default)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--profiles", required=True)
    args = ap.parse_args()
    cache = Path(args.profiles)
    profiles = load_profiles(cache)
    ways = ("as priced", "with the budget")
    met = {w: [0] * 5 for w in ways}
    ncells = 0
    for name in args.folders:
        cells = price(Path(name), profiles, lambda r, topo: [topo, replace(topo, quota=PERIOD * 2 / r["hosts"])])
        ncells += report(name, cells, ways, met)
    for way, n in met.items():
        print(summary(way, n, ncells))
    save_profiles(cache, profiles)


main()
