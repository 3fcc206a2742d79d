"""The scheduled alltoall path before and after the sampled softmax's table was prefetched for the targets, paired.

One emulated cluster (4 hosts, the overlap scenario's cell lstm_lm_b256 at 25 Mbit/s, or the hosts, model and rate
given); each round runs the
committed code of both checkouts one after the other (order alternating by round), same flags, data and steps.
Run as root from the repository root:

    git worktree add -f /tmp/old a05d7cb      # the code before the change
    python bench/local-probes/head-prefetch-2026-12-02/ab.py 5 /tmp/old/src src > ab.txt
    python bench/local-probes/head-prefetch-2026-12-02/ab.py 5 /tmp/old/src src 8 lstm_lm 50mbit > ab-8h.txt
"""

import json
import statistics
import sys
from pathlib import Path

from tessel.bench.runner import _record
from tessel.bench.scenarios import OVERLAP
from tessel.bench.stats import paired_ratio
from tessel.cluster.emulate import HOST_INTERFACE, EmulatedCluster

rounds, before, after = int(sys.argv[1]), sys.argv[2], sys.argv[3]
given = len(sys.argv) > 4
hosts, model, rate = (int(sys.argv[4]), sys.argv[5], sys.argv[6]) if given else (4, "lstm_lm_b256", "25mbit")
out = Path(f"/tmp/head-ab-{hosts}-{model}-{rate}")
args = ["-m", "tessel", "train", "--metrics.interface", HOST_INTERFACE, *OVERLAP.common,
        *OVERLAP.models[model], *OVERLAP.strategies["alltoall"], "--steps", str(OVERLAP.steps)]
records = {"before": {}, "after": {}}
with EmulatedCluster(hosts, rate=None, prefix="tsab") as emu:
    emu.set_rate(rate)
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        for name, src in (order if r % 2 == 0 else order[::-1]):
            where = out / f"{name}-r{r}"
            emu.run(emu.torchrun_commands([*args, "--out", str(where)], run_id=f"ab{r}{name}"), timeout=900,
                    env={"PYTHONPATH": str(Path(src).resolve())})
            rec = _record(json.loads((where / "summary.json").read_text()))
            records[name][r] = rec
            waits = {k: round(v * 1000, 1) for k, v in (rec["sparse_waits"] or {}).items()}
            print(f"round {r} {name:<6} {rec['step_time'] * 1000:7.1f} ms/step  waits {waits}  own work "
                  f"{(rec['sparse_work'] or 0) * 1000:.1f} ms  sent/step {rec['bytes_per_step']}", flush=True)
ratio = paired_ratio({r: x["step_time"] for r, x in records["before"].items()},
                     {r: x["step_time"] for r, x in records["after"].items()})
for name, recs in records.items():
    med = statistics.median(x["step_time"] for x in recs.values()) * 1000
    print(f"{name}: median {med:.1f} ms/step over {len(recs)} runs")
print(f"after over before (before's step / after's, paired by round): {ratio}")
Path(out / "ab.json").write_text(json.dumps(records, indent=1))
