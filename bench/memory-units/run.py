"""The memory benchmark's planner search again, with FSDP's units priced beside the tensors (2026-11-29).

    sudo python bench/memory-units/run.py

The other plans' searches are those saved in bench/memory-timed/results.json (ddp, fsdp, fsdp-tp,
pp-tp-fsdp-recompute, run on 2026-11-27); they, the planner's search of that day and the planner's search of
2026-11-29 (bench/memory-replan/search.json) are the evidence the budget is taken from before each try
(`tessel.bench.fit.overhead`: the most any of those runs' hosts held beside its tensors and FSDP's units). Writes
search.json, results.json and report.md here; each try's folder is runs/planner-l<depth>.
"""

import json
import sys
from pathlib import Path

from tessel.bench import fit
from tessel.cluster.emulate import EmulatedCluster

OUT = Path(__file__).parent
ROOT = OUT.parent


def main() -> None:
    saved = json.loads((ROOT / "memory-timed" / "results.json").read_text())["found"]
    replan = json.loads((ROOT / "memory-replan" / "search.json").read_text())
    evidence = fit._runs(saved) + replan["runs"]
    fit.MAX_RUNS = 12  # (the search of 2026-11-29 needed 11 tries to bracket its largest depth)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with EmulatedCluster(fit.HOSTS, rate=fit.RATE, prefix="tsmem", memory=fit.LIMIT) as emu:
        found = fit.search("planner", emu, OUT, None, log, evidence)
    (OUT / "search.json").write_text(json.dumps(found))
    budget = fit.LIMIT - fit.overhead(evidence + found["runs"])
    others = [f for f in saved if f["strategy"] != "planner"]
    argv = ["python", "bench/memory-units/run.py"]
    (OUT / "results.json").write_text(json.dumps({"found": [*others, found], "timed": [], "depth": 0,
                                                  "budget": budget, "argv": argv}))
    (OUT / "report.md").write_text(fit.report([*others, found], [], 0, budget, argv))
    print((OUT / "report.md").read_text())


if __name__ == "__main__":
    main()
