"""What the held-mesh re-pricing scripts share: a saved row's topology, with its probe's latencies or given ones, the
held mesh's latencies per host count and rate (probes.jsonl), the pricing of a folder's rows on several topologies,
the count of cells meeting each goal, the printed report and the cache of the profiles."""
import json
import os
import pickle
import statistics
import sys
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.cluster.emulate import parse_rate
from tessel.planner.topology import Topology

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
from reprice_common import score as pc_score  # noqa: E402


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



def report(name: str, cells: dict, ways: tuple[str, ...], met: dict) -> int:
    """Print each of a folder's ``cells`` ({cell: [(row, [seconds priced each of ``ways``])]}): per way its score,
    then each row's prices and measured time; add each way's goals met to ``met``; returns the cells printed."""
    for cell, rows in cells.items():
        print(f"{name} {cell}:", flush=True)
        width = max(16, max(map(len, ways)) + 1)
        for k, way in enumerate(ways):
            rs = [{**r, "predicted": got[k]} for r, got in rows]
            print(f"  {way:{width}s}{pc_score(rs)}")
            met[way] = [m + ok for m, ok in zip(met[way], goals(rs))]
        for r, got in rows:
            print(f"    {r['plan']}: " + " -> ".join(f"{g * 1e3:.0f}" for g in got)
                  + f" ms, measured {r['measured'] * 1e3:.0f}")
    return len(cells)


def load_profiles(path: Path) -> dict:
    """The profiles cached at ``path`` by an earlier run, {(folder/model/hosts): Profile}. A profile cached before
    2026-12-07's third session holds each recompute share as one number, timed at the global batch: it is read as
    that size's."""
    profiles = {k: pickle.loads(v) for k, v in pickle.loads(path.read_bytes()).items()} if path.exists() else {}
    for p in profiles.values():
        for layer in p.layers:
            layer.again = {k: v if isinstance(v, dict) else {p.memory_samples: v} for k, v in layer.again.items()}
    return profiles


def save_profiles(path: Path, profiles: dict) -> None:
    for p in profiles.values():
        p.job, p._shards = None, {k: v for k, v in p._shards.items() if k[0] == "timed"}
    path.write_bytes(pickle.dumps({k: pickle.dumps(p) for k, p in profiles.items()}))


def price(folder: Path, profiles: dict, topos, latencies: dict | None = None) -> dict:
    """{cell: [(row, [seconds on each topology])]} of a saved folder's measured rows, each priced by the estimate on
    one profile per (folder, model, hosts) (made and cached in ``profiles`` where missing) on the topologies
    ``topos(row, topo)`` gives from the row's own, without a wait or a quota (None: the row is left out). A cell run
    before the probe held a job's mesh starts from the held mesh's latencies (:func:`held_latencies`), or, for a host
    count and rate they were not measured at, ``latencies`` {(hosts, rate): {"latency", "tiny_latency"}}."""
    from reprice_common import measured_rows, plan_of

    from tessel.config import load_config
    from tessel.planner import choose
    from tessel.planner.estimate import estimate
    from tessel.resolve import job_of, settings_of

    held, cells = {**(latencies or {}), **held_latencies()}, {}
    for r in measured_rows(folder):
        cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
        own = folder.name.startswith("plan-mesh") or "wait" in (r.get("probe") or {})  # probed with the mesh held
        topo = topology(r, None if own else held[(r["hosts"], r["rate"])])
        ts = topos(r, topo)
        if ts is None:
            continue
        key = f"{folder.name}/{r['model']}/{r['hosts']}"
        if key not in profiles:
            profiles[key] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
        profiles[key].job = job_of(cfg)
        plan, settings = plan_of(folder, r, cfg), settings_of(cfg)
        got = [estimate(plan, settings, profiles[key], t).step for t in ts]
        cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r, got))
    return cells
