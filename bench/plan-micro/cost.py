"""What timing a step in up to 16 micro-batches costs the profile: `measure` at the micro-batch sizes a 4-host cell's
candidates use (the global batch over 1 to 32), with the step timed (as the profile does) and without it
(``timing.micro_batches_for`` held at 1), alternating, 3 times each, per model (the default model and `tessel bench
plan`'s three).

    python bench/plan-micro/cost.py > bench/plan-micro/cost.txt
"""
import statistics
import time

from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.planner import profile as prof
from tessel.planner import timing
from tessel.resolve import job_of

MODELS = {"default": [], **{f"bench plan's {k}": [*v, *pc.COMMON] for k, v in pc.MODELS.items()}}
many = timing.micro_batches_for

for name, overrides in MODELS.items():
    job = job_of(load_config(None, overrides))
    b = job.settings.global_batch
    sizes = tuple(sorted({b // k for k in (1, 2, 4, 8, 16, 32) if b % k == 0}))
    secs = {"without": [], "with": []}
    for i in range(6):
        label = "with" if i % 2 == 0 else "without"
        timing.micro_batches_for = many if label == "with" else (lambda b, sizes: 1)
        t0 = time.perf_counter()
        p = prof.measure(job, sizes=sizes)
        secs[label].append(time.perf_counter() - t0)
    timing.micro_batches_for = many
    print(f"{name} (batch {b}, {many(b, list(sizes))} micro-batches): " + "; ".join(
        f"{k} {statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})" for k, v in secs.items()), flush=True)
