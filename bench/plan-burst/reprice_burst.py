"""Saved cells priced two ways by today's estimate on one profile per (folder, model, hosts): with the probe's wait,
quota and FSDP rates (the last way of bench/plan-wait/reprice_probed.py), and with those and the bytes a link passes
at once after idling (Topology.link_burst) from a probe run afresh at the cell's host count and rate
(bench/plan-burst/probes.jsonl, its first line there). The profiles are cached at --profiles (made afresh where
missing: today's, with the recompute share by size and the runtime's cost per micro-batch).

    python bench/plan-burst/reprice_burst.py --profiles /tmp/pg-burst.pkl bench/plan-latency-4h-200 \
        bench/plan-tail-4h-1g bench/plan-tail-6h-200 bench/plan-tail-8h-1g bench/plan-tail-8h-200 \
        bench/plan-mesh-4h-200 bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g bench/plan-mesh-8h-200 \
        bench/plan-wait-8h-500 bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 bench/plan-micro-4h-300 \
        > bench/plan-burst/reprice_burst.txt
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

for sub in ("", "plan-probe-groups", "plan-wait"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / sub))
from held import price, report, save_profiles, summary  # noqa: E402
from reprice_probed import probed_ways, setup  # noqa: E402

WAYS = ("without the link's burst", "with it")


def bursts() -> dict:
    """(hosts, rate) -> the bytes the first probe there measured a link passing at once after idling."""
    out = {}
    for line in (Path(__file__).resolve().parent / "probes.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.setdefault((d["hosts"], d["rate"]), d["link_burst"])
    return out


def main():
    args, points, latencies, profiles = setup()
    burst = bursts()
    met = {w: [0] * 5 for w in WAYS}
    ncells = 0

    def ways(r, topo):
        probed = probed_ways(r, topo, points)
        if not probed or (r["hosts"], r["rate"]) not in burst:
            return None
        return [probed[-1], replace(probed[-1], link_burst=burst[(r["hosts"], r["rate"])])]
    for name in args.folders:
        ncells += report(name, price(Path(name), profiles, ways, latencies), WAYS, met)
    for way, n in met.items():
        print(summary(way, n, ncells))
    save_profiles(Path(args.profiles), profiles)


if __name__ == "__main__":
    main()
