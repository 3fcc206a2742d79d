"""Saved cells priced four ways by the estimate on one profile per (folder, model, hosts): without the probe's wait
after compute and quota (as cells before 2026-12-07's second session were priced); with the wait
(Topology.wait_points); with the wait and the quota (Topology.quota: a flushed pipeline's fill and drain at a whole
core for the host's quota, shape b); and with those and FSDP's measured rates (Topology.fsdp_points). The wait and
quota come from the cell's own probe where it measured them, else from a probe of the same host count and rate run
afresh (bench/plan-wait/probes.jsonl, the first line of each); FSDP's rates from the first probe there that measured
them (a later run). Cells run before the probe held a job's mesh are priced at the held mesh's latencies, as
bench/plan-probe-groups/reprice_groups.py prices them, or, where those were not measured, at the latencies of the probe
run afresh.

    python bench/plan-wait/reprice_probed.py --profiles /tmp/pg.pkl bench/plan-latency-4h-200 bench/plan-tail-4h-1g \
        bench/plan-tail-6h-200 bench/plan-tail-8h-1g bench/plan-tail-8h-200 bench/plan-mesh-4h-200 \
        bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g bench/plan-mesh-8h-200 bench/plan-wait-8h-500 \
        bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 > bench/plan-wait/reprice_probed.txt
"""
import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tessel.planner.topology import wait_points

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for what the re-pricing scripts share
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-probe-groups"))
from held import load_profiles, price, report, save_profiles, summary  # noqa: E402

WAYS = ("as priced", "with the wait", "wait and quota", "and FSDP's rates")


def probes() -> dict:
    """(hosts, rate) -> the first probe run there, with the FSDP rates of the first that measured them."""
    out, fsdp = {}, {}
    for line in (Path(__file__).resolve().parent / "probes.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.setdefault((d["hosts"], d["rate"]), d)
        if "fsdp" in d:
            fsdp.setdefault((d["hosts"], d["rate"]), d["fsdp"])
    return {k: {**d, "fsdp": fsdp.get(k, ())} for k, d in out.items()}


def probed_ways(r: dict, topo, points: dict) -> list | None:
    """A saved row's topology ``topo`` four ways (:data:`WAYS`): without, with the wait, with the wait and the
    quota, and with those and FSDP's rates, from the row's own probe or ``points`` (:func:`probes`); None: no probe
    there."""
    d = r["probe"] if "wait" in (r.get("probe") or {}) else points.get((r["hosts"], r["rate"]))
    if not d:
        return None
    waited = replace(topo, wait_points=wait_points(d))
    fsdp = d.get("fsdp") or points.get((r["hosts"], r["rate"]), {}).get("fsdp", ())
    return [topo, waited, replace(waited, quota=d["quota"]),
            replace(waited, quota=d["quota"], fsdp_points=tuple((int(g), a, b) for g, a, b in fsdp))]


def setup() -> tuple:
    """(the command line's folders and profile cache, :func:`probes`, the latencies a cell probed before the
    probe held a job's mesh is priced at, the cached profiles)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--profiles", required=True)
    args = ap.parse_args()
    points = probes()
    # (cells run before the probe held a job's mesh, at a host count and rate that held-mesh probes of then missed:
    # the latencies of the probe run afresh there, which holds the mesh)
    latencies = {k: {"latency": d["latency"], "tiny_latency": d["tiny_latency"]} for k, d in points.items()}
    return args, points, latencies, load_profiles(Path(args.profiles))


def main():
    args, points, latencies, profiles = setup()
    cache = Path(args.profiles)
    met = {w: [0] * 5 for w in WAYS}
    ncells = 0

    def ways(r, topo):
        return probed_ways(r, topo, points)
    for name in args.folders:
        ncells += report(name, price(Path(name), profiles, ways, latencies), WAYS, met)
    for way, n in met.items():
        print(summary(way, n, ncells))
    save_profiles(cache, profiles)


if __name__ == "__main__":
    main()
