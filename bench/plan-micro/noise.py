"""How steady the profile's per-micro-batch cost is: `tessel.planner.timing.layers_and_steps` run 3 times over on one of
`tessel bench plan`'s models at 7 rounds (the profile takes 3), with a step in 4 micro-batches or the count given;
each round's value (the step in that many micro-batches against its price at the round's step factor, over one
fewer) and their median, in ms of a core. Runs where it takes ``micro`` (commit 9000c97 and after; there
``profile._rounds``).

    python bench/plan-micro/noise.py transformer_lm [16] >> bench/plan-micro/noise.txt
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common

from reprice_common import built  # noqa: E402

from tessel.planner import timing

name, micro = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
job, model, chain, x, y = built(name)
b = job.settings.global_batch
sizes = sorted({b // k for k in (32, 16, 8, 4, 2, 1) if b % k == 0})
timing.ROUNDS = 7
for _ in range(3):
    costs, real, many = timing.layers_and_steps(model, chain, job.settings, x, y, sizes, micro)
    per = []
    for (step, layers, opt), (step_many, layers_many) in zip(real, many):
        factor = step / (sum(layers) + opt)
        per.append((step_many - factor * (micro * layers_many + opt)) / (micro - 1) * 1e3)
    print(f"{name}, {micro} micro-batches, 7 rounds: each round's per_micro {[round(v, 2) for v in per]} ms, median "
          f"{statistics.median(per):.2f}", flush=True)
