"""What timing the recompute shares at the smallest profiled micro-batch as well costs the profile: the shares at the
global batch only against at 1 sample and the global batch (what the profile takes when the candidates' smallest
micro-batch is 1 sample), alternating, 4 times each, per model (the default model and `tessel bench plan`'s three).

    python bench/plan-recompute/cost.py > bench/plan-recompute/cost.txt
"""
import statistics
import time

import torch

from tessel.bench import plan_check as pc
from tessel.chain import chain_of
from tessel.config import load_config
from tessel.planner.timing import recompute_shares
from tessel.resolve import job_of

MODELS = {"default": [], **{f"bench plan's {k}": [*v, *pc.COMMON] for k, v in pc.MODELS.items()}}

torch.set_num_threads(1)  # as the profile runs
for name, overrides in MODELS.items():
    job = job_of(load_config(None, overrides))
    torch.manual_seed(0)
    model = job.build()
    chain = chain_of(model)
    b = job.settings.global_batch
    x, y = job.batch(b, 1)
    secs = {"global batch only": [], "1 sample and the global batch": []}
    for i in range(8):
        label = list(secs)[i % 2]
        t0 = time.perf_counter()
        recompute_shares(model, chain, x, y, (b,) if i % 2 == 0 else (1, b))
        secs[label].append(time.perf_counter() - t0)
    print(f"{name} (batch {b}): " + "; ".join(f"{k} {statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})"
                                              for k, v in secs.items()), flush=True)
