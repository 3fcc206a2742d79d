"""How steady the profile's per-micro-batch cost is, two ways on the same timings, for one of `tessel bench plan`'s
models: the profile's (``timing.per_micro`` over ``timing.ROUNDS`` rounds, each round's step in 16 micro-batches
against its price at that round's step factor), and from pairs (after the rounds, ``PAIRS`` pairs of the real step
in one micro-batch and in 16, run back to back in alternating order: the median of the pairs' differences, less
what the layers' medians say 16 micro-batches of 1/16 of the batch cost beyond one of the whole batch at the
profile's step factor, over 15; and by ratio: the median of the pairs' ratios, the step in 16 over the step in
one, times the step in one priced at the profile's step factor as its layers' medians and the optimizer, less the
same price of the step in 16, over 15). Repeated ``REPEATS`` times; ms of a core.

Runs with 8b65c76's package (``layers_and_steps`` timing the step in 16 micro-batches in its rounds), where the
third figure printed, "by ratio", is what 2d91a2f tried (from 7 pairs after the rounds there):

    git worktree add /tmp/wt-8b65c76 8b65c76
    PYTHONPATH=/tmp/wt-8b65c76/src python bench/plan-micro-steady/noise.py transformer_lm >> \
        bench/plan-micro-steady/noise.txt
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common

from reprice_common import built  # noqa: E402

from tessel.planner import timing  # noqa: E402

PAIRS, REPEATS = 7, 5
name = sys.argv[1]
job, model, chain, x, y = built(name)
b = job.settings.global_batch
sizes = sorted({b // k for k in (32, 16, 8, 4, 2, 1) if b % k == 0})
micro = timing.micro_batches_for(b, sizes)
one, many = timing.real_step(model, job.settings, x, y), timing.real_step(model, job.settings, x, y, micro)
for _ in range(REPEATS):
    t0 = time.perf_counter()
    costs, real, rounds = timing.layers_and_steps(model, chain, job.settings, x, y, sizes, micro)
    t1 = time.perf_counter()
    profiled = timing.per_micro(real, rounds, micro)
    factor, _ = timing.step_factor(real, sum(p.numel() for p in model.parameters()))
    diffs, ratios = [], []
    for k in range(PAIRS):
        a, m = (one(), many()) if k % 2 == 0 else reversed((many(), one()))
        diffs.append(m - a)
        ratios.append(m / a)
    t2 = time.perf_counter()
    layers = {n: sum(c.seconds for c in costs[n]) for n in (b, b // micro)}
    paired = (statistics.median(diffs) - factor * (micro * layers[b // micro] - layers[b])) / (micro - 1)
    opt = statistics.median(o for _, _, o in real)
    ratio = factor * (statistics.median(ratios) * (layers[b] + opt) - micro * layers[b // micro] - opt) / (micro - 1)
    print(f"{name}, {micro} micro-batches: profiled {profiled * 1e3:.2f} ms ({t1 - t0:.1f} s), paired "
          f"{max(paired, 0) * 1e3:.2f} ms, by ratio {max(ratio, 0) * 1e3:.2f} ms ({t2 - t1:.1f} s; "
          f"the pairs' differences "
          f"{[round(d * 1e3, 1) for d in diffs]} ms, factor {factor:.3f})", flush=True)
