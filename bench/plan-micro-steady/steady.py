"""The profile's per-micro-batch cost as built (`timing.layers_and_steps` and `timing.per_micro`: the step in 16
micro-batches over the step in one, a pair in each of the 3 rounds and 4 after them), 5 times over for each of
`tessel bench plan`'s models, ms of a core; each with its 7 ratios.

Runs with 2d91a2f's package (tried, then taken back):

    git worktree add /tmp/wt-2d91a2f 2d91a2f
    PYTHONPATH=/tmp/wt-2d91a2f/src python bench/plan-micro-steady/steady.py > bench/plan-micro-steady/steady.txt
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common

from reprice_common import built  # noqa: E402

from tessel.planner import timing  # noqa: E402

for name in ("classifier", "lstm_lm", "transformer_lm"):
    job, model, chain, x, y = built(name)
    b = job.settings.global_batch
    sizes = sorted({b // k for k in (32, 16, 8, 4, 2, 1) if b % k == 0})
    micro = timing.micro_batches_for(b, sizes)
    for _ in range(5):
        costs, real, ratios = timing.layers_and_steps(model, chain, job.settings, x, y, sizes, micro)
        layers = tuple(sum(c.seconds for c in costs[n]) for n in (b, b // micro))
        value = timing.per_micro(real, layers, ratios, micro)
        print(f"{name}, {micro} micro-batches: per_micro {value * 1e3:.2f} ms (ratios "
              f"{[round(r, 3) for r in ratios]})", flush=True)
