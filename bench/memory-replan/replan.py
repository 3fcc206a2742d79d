"""The memory benchmark's planner search run again with today's planner, on the benchmark's own hosts, limit and
budget (tessel.bench.fit), in the steps it was run on 2026-11-29:

    python bench/memory-replan/replan.py at 36          # the pick at 36 layers, under the limit -> results.json
    python bench/memory-replan/replan.py search         # fit.search from 2 layers (8 runs at most) -> search.json
    python bench/memory-replan/replan.py bisect         # on from search.json until the largest fit is bracketed
    python bench/memory-replan/replan.py unlimited 34 32  # those picks without the limit -> unlimited.json

The budget is the one the 2026-11-27 search gave the planner (the host's limit less what a sharded worker's host
held besides its tensors there); each run's folder is runs/planner-l<depth> (or unlimited-l<depth>). The runs of
2026-11-29 were made by one-off scripts doing these same calls; this file gathers them and was not run as such.
"""

import json
import sys
from pathlib import Path

from tessel.bench import fit
from tessel.cluster.emulate import EmulatedCluster

OUT = Path(__file__).parent
BUDGET = 60795356  # bench/memory/results.json's budget


def attempt(emu, depth: int) -> dict:
    where = OUT / "runs" / f"planner-l{depth}"
    rec = {"strategy": "planner", "layers": depth, "params": fit.params_of(depth)}
    path, picked = fit._plan(depth, BUDGET, where)
    if path is None:
        return {**rec, "fits": False, "refused": picked}
    args = ["-m", "tessel", "train", *fit.WIDTH, *fit.COMMON, "--model.layers", str(depth), "--plan", str(path),
            "--steps", str(fit.FIT_STEPS)]
    return {**rec, "pick": picked, **fit._run(emu, args, where)}


def bisect(emu) -> dict:
    found = json.loads((OUT / "search.json").read_text())
    fits = {r["layers"] for r in found["runs"] if r.get("fits")}
    fails = {r["layers"] for r in found["runs"] if not r.get("fits")}
    while min(d for d in fails if d > max(fits)) > max(fits) + 1:
        depth = (max(fits) + min(d for d in fails if d > max(fits)) + 1) // 2
        rec = attempt(emu, depth)
        found["runs"].append(rec)
        (fits if rec["fits"] else fails).add(depth)
        print(f"planner at {depth}: {'trains' if rec['fits'] else rec.get('refused') or 'out of memory'}", flush=True)
    return {**found, "largest": max(fits), "params": fit.params_of(max(fits)), "bracketed": True}


def unlimited(emu, depths: list[int]) -> list[dict]:
    out = []
    for depth in depths:
        args = ["-m", "tessel", "train", *fit.WIDTH, *fit.COMMON, "--model.layers", str(depth), "--plan",
                str(OUT / "runs" / f"planner-l{depth}" / "plan.json"), "--steps", str(fit.FIT_STEPS)]
        out.append({"layers": depth, **fit._run(emu, args, OUT / "runs" / f"unlimited-l{depth}")})
    return out


def main(verb: str, args: list[str]) -> None:
    limit = None if verb == "unlimited" else fit.LIMIT
    with EmulatedCluster(fit.HOSTS, rate=fit.RATE, prefix="tsmem", memory=limit) as emu:
        if verb == "at":
            (OUT / "results.json").write_text(json.dumps([attempt(emu, int(args[0]))], indent=1))
        elif verb == "search":
            found = fit.search("planner", emu, OUT, BUDGET, print)
            (OUT / "search.json").write_text(json.dumps(found, indent=1))
        elif verb == "bisect":
            (OUT / "search.json").write_text(json.dumps(bisect(emu), indent=1))
        else:
            (OUT / "unlimited.json").write_text(json.dumps(unlimited(emu, [int(a) for a in args]), indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
