"""What the held-mesh re-pricing scripts share: a saved row's topology, with its probe's latencies or given ones, the
held mesh's latencies per host count and rate (probes.jsonl), and the count of cells meeting each goal."""
import json
import os
import statistics
from pathlib import Path

from tessel.bench import plan_check as pc
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


def goals(rs: list[dict]) -> tuple[bool, ...]:
    """One cell's rows (each with "predicted" and "measured"): median <= 10%, worst <= 30%, Spearman >= 0.8, the pick
    within, the pick a miss (judged as `tessel bench plan` judges it)."""
    errs = [abs(r["predicted"] - r["measured"]) / r["measured"] for r in rs]
    verdict = pc._pick(rs)[1]
    return (statistics.median(errs) <= 0.10, max(errs) <= 0.30,
            pc._spearman([r["predicted"] for r in rs], [r["measured"] for r in rs]) >= 0.8,
            verdict == "within", verdict == "miss")


def summary(label: str, n: list[int], cells: int) -> str:
    """The line that counts, over ``cells``, the cells meeting each of :func:`goals` (``n``, in its order)."""
    return (f"{label}: median <= 10% on {n[0]}, worst <= 30% on {n[1]}, Spearman >= 0.8 on {n[2]}; picks {n[3]} "
            f"within, {n[4]} misses, of {cells} cells")
