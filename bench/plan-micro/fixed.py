"""The saved cells priced by today's estimate (commit 7abe508: the probe's wait, quota and FSDP rates, the recompute
share at the micro-batch) on the profiles cached by bench/plan-recompute/reprice_sizes.py, without and with a fixed
cost per micro-batch beyond the first, in ms of a core per model (Transformer, LSTM, classifier) given on the command
line, at the host's speed, (m - 1)/m of it a micro-batch, in a pipeline too (through Topology.per_micro, scaled so).
The figures 1.1, 0.3 and 1.4 are one timing of each model's engine step (engine.py, at 8, 8 and 4 micro-batches):
a check of the pricing's shape, not a measurement the planner could make (noise.txt).

    python bench/plan-micro/fixed.py 1.1 0.3 1.4 bench/plan-latency-4h-200 bench/plan-tail-4h-1g \
        bench/plan-tail-6h-200 bench/plan-tail-8h-1g bench/plan-tail-8h-200 bench/plan-mesh-4h-200 \
        bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g bench/plan-mesh-8h-200 bench/plan-wait-8h-500 \
        bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 > bench/plan-micro/fixed.txt
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
CPU = dict(zip(("transformer_lm", "lstm_lm", "classifier"), map(float, sys.argv[1:4])))
points = probes()
latencies = {k: {"latency": d["latency"], "tiny_latency": d["tiny_latency"]} for k, d in points.items()}
profiles = load_profiles(Path("/tmp/pg-sizes.pkl"))


def ways(r, topo):
    probed = probed_ways(r, topo, points)
    if not probed:
        return None
    today = probed[-1]
    pp, m = int(re.search(r"pp(\d+)", r["plan"]).group(1)), int(re.search(r" m(\d+)", r["plan"]).group(1))
    scale = (m - 1) / m if pp > 1 else 1.0  # (the estimate scales a trial's by (m - 1)/m itself where pp is 1)
    return [today, replace(today, per_micro=CPU[r["model"]] * 1e-3 / today.speed * scale)]


met, ncells = {w: [0] * 5 for w in WAYS}, 0
for folder in sys.argv[4:]:
    ncells += report(folder, price(Path(folder), profiles, ways, latencies), WAYS, met)
for way, n in met.items():
    print(summary(way, n, ncells))
