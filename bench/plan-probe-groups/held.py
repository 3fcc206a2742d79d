"""What the held-mesh re-pricing scripts share: a saved row's topology, with its probe's latencies or given ones, and
the held mesh's latencies per host count and rate (probes.jsonl)."""
import json
import os
from pathlib import Path

from tessel.cluster.emulate import parse_rate
from tessel.planner.topology import Topology


def held_latencies() -> dict:
    """(hosts, rate) -> the held-mesh probe's latency and tiny latency (groups.py's output)."""
    out = {}
    for line in (Path(__file__).resolve().parent / "probes.jsonl").read_text().splitlines():
        d = json.loads(line)
        out[(d["hosts"], d["rate"])] = {"latency": d["latency"], "tiny_latency": d["tiny_latency"]}
    return out


def topology(r: dict, latencies: dict | None) -> Topology:
    """The cell's topology as priced in its run, its latencies from its probe or, given, ``latencies``. A calibrated
    row (the trial's cell) is priced at its probe's rates, its speed capped at the host's CPU budget, as
    bench/plan-latency/reprice_latency.py prices it."""
    probe = {**r["probe"], **(latencies or {})}
    own = {"speed": r["speed"], "rate_mbit": r["rate_mbit"], "overlap": r["overlap"]}
    if r.get("calibrated"):
        own = {"speed": min(probe["speed"], (os.cpu_count() or 1) / r["hosts"]), "rate_mbit": probe["mbit"],
               "overlap": probe["overlap"]}
    return Topology(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6,
                    latency=probe["latency"], tiny_latency=probe["tiny_latency"], source="saved probe", **own)
