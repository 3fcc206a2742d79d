"""The recompute shares (the share of a layer's time a full recompute adds) of the default model at its global
batch, alternating, 4 calls each: the estimator tried (`after`: one timed run a round over 3 rounds, not committed)
against `tessel.planner.profile._recompute_shares` as committed (three timed runs a round). Per call its seconds and
each layer's 'layers' share."""
import time

import torch

from tessel.chain import chain_of, recomputed
from tessel.config import load_config
from tessel.pipeline.partition import profile
from tessel.planner.profile import _recompute_shares
from tessel.resolve import job_of


def after(model, chain, x, y, rounds=3):  # the change tried: one timed run a round, the first round warmed up
    kinds = {"none": chain, "layers": recomputed(chain, model),
             "selective": recomputed(chain, model, keep_matmuls=True)}
    best = {}
    for r in range(rounds):
        for kind, c in kinds.items():
            secs = [cost.seconds for cost in profile(model, c, x, y, repeats=1, reuse=True, warm=r == 0)]
            best[kind] = [min(a, b) for a, b in zip(best[kind], secs)] if kind in best else secs
    return [{k: max(best[k][i] / base - 1, 0.0) if base > 0 else 0.0 for k in ("layers", "selective")}
            for i, base in enumerate(best["none"])]


torch.set_num_threads(1)
job = job_of(load_config(None, []))
torch.manual_seed(0)
model = job.build()
chain = chain_of(model)
x, y = job.batch(job.settings.global_batch, 1)
for i in range(8):
    name, f = ("after", after) if i % 2 == 0 else ("before", _recompute_shares)
    t0 = time.perf_counter()
    got = f(model, chain, x, y)
    print(f"{name:6s} {time.perf_counter() - t0:4.1f} s  layers shares {[round(g['layers'], 2) for g in got]}",
          flush=True)
