"""The saved cells priced by the estimate of commit 6c64e4a (the probe's wait, quota and FSDP rates, the recompute
share at the micro-batch; a trial's per_micro charged on every slot of a pipeline stage, (m - 1)/m of it a
micro-batch in one process) on the profiles cached by bench/plan-recompute/reprice_sizes.py (which hold no
per_micro), without and with a fixed cost per micro-batch beyond the first, in ms of a core per model (Transformer,
LSTM, classifier) given on the command line, at the host's speed, passed as a trial's: (m - 1)/m of it a
micro-batch, in a pipeline too (scaled so); with --every, on every micro-batch of a pipeline stage. The figures are
timings of each model's engine step (engine.py): a check of the pricing's shape, not a measurement the planner
could make (noise.txt). Run it with 6c64e4a's package first on the path:

    git worktree add /tmp/wt-6c64e4a 6c64e4a
    PYTHONPATH=/tmp/wt-6c64e4a/src python bench/plan-micro/fixed.py 1.1 0.3 1.4 bench/plan-latency-4h-200 \
        bench/plan-tail-4h-1g bench/plan-tail-6h-200 bench/plan-tail-8h-1g bench/plan-tail-8h-200 \
        bench/plan-mesh-4h-200 bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g bench/plan-mesh-8h-200 \
        bench/plan-wait-8h-500 bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 > bench/plan-micro/fixed.txt
    (the same with 1.0 0.66 1.33 > fixed-kept-run.txt, and with --every 1.0 0.66 1.33 > fixed-every.txt)
"""
import re
import sys
from dataclasses import replace
from pathlib import Path

for sub in ("", "plan-probe-groups", "plan-wait"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / sub))
from held import load_profiles, price, report, summary  # noqa: E402
from reprice_probed import probed_ways, probes  # noqa: E402

WAYS = ("today", "per micro")
EVERY = "--every" in sys.argv  # charged on every micro-batch of a pipeline stage
ARGS = [a for a in sys.argv[1:] if a != "--every"]
CPU = dict(zip(("transformer_lm", "lstm_lm", "classifier"), map(float, ARGS[:3])))
points = probes()
latencies = {k: {"latency": d["latency"], "tiny_latency": d["tiny_latency"]} for k, d in points.items()}
profiles = load_profiles(Path("/tmp/pg-sizes.pkl"))


def ways(r, topo):
    probed = probed_ways(r, topo, points)
    if not probed:
        return None
    today = probed[-1]
    pp, m = int(re.search(r"pp(\d+)", r["plan"]).group(1)), int(re.search(r" m(\d+)", r["plan"]).group(1))
    scale = (m - 1) / m if pp > 1 and not EVERY else 1.0  # (6c64e4a scales a trial's by (m - 1)/m where pp is 1)
    return [today, replace(today, per_micro=CPU[r["model"]] * 1e-3 / today.speed * scale)]


met, ncells = {w: [0] * 5 for w in WAYS}, 0
for folder in ARGS[3:]:
    ncells += report(folder, price(Path(folder), profiles, ways, latencies), WAYS, met)
for way, n in met.items():
    print(summary(way, n, ncells))
