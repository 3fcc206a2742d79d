"""How steady the profile's per-micro-batch cost is: `tessel.planner.profile._rounds` run 3 times over on one of
`tessel bench plan`'s models at 7 rounds (the profile takes 3), with a step in 4 micro-batches; each round's value
(the step in 4 micro-batches against its price at the round's step factor, over 3) and their median, in ms of a core.
Runs on commit 2026-12-07's "tried" commit named in bench/plan-micro/README.md, where _rounds takes ``micro``.

    python bench/plan-micro/noise.py transformer_lm >> bench/plan-micro/noise.txt
"""
import statistics
import sys

import torch

from tessel.bench.plan_check import COMMON, MODELS
from tessel.chain import chain_of
from tessel.config import load_config
from tessel.planner import profile as prof
from tessel.resolve import job_of

torch.set_num_threads(1)
name = sys.argv[1]
job = job_of(load_config(None, MODELS[name] + COMMON))
torch.manual_seed(0)
model = job.build()
chain = chain_of(model)
b = job.settings.global_batch
x, y = job.batch(b, 1)
sizes = sorted({b // k for k in (32, 16, 8, 4, 2, 1) if b % k == 0})
prof.ROUNDS = 7
for _ in range(3):
    costs, real, many = prof._rounds(model, chain, job.settings, x, y, sizes, 4)
    per = []
    for (step, layers, opt), (step_many, layers_many) in zip(real, many):
        factor = step / (sum(layers) + opt)
        per.append((step_many - factor * (4 * layers_many + opt)) / 3 * 1e3)
    print(f"{name}, 7 rounds: each round's per_micro {[round(v, 2) for v in per]} ms, median "
          f"{statistics.median(per):.2f}", flush=True)
