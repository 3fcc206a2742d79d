"""The profile's recompute shares, before (each kind's fastest of 3 rounds x 3 runs, each call warmed) and after (the
installed tessel's: the median of 5 rounds' ratios to the round's plain run, one run each, warmed once, the order
reversed every other round), alternating, N times each per model: seconds and the shares' spread.

    python bench/plan-profile-cost/shares.py 6 shares.json
"""

import json
import statistics
import sys
import time

import torch

from tessel.bench.plan_check import COMMON, MODELS
from tessel.chain import chain_of
from tessel.config import load_config
from tessel.pipeline.partition import profile
from tessel.planner import profile as prof
from tessel.planner.profile import recomputed
from tessel.resolve import job_of


def before(model, chain, x, y, rounds=3):
    """``_recompute_shares`` as it was at 1ebe7a9."""
    kinds = {"none": chain, "layers": recomputed(chain, model),
             "selective": recomputed(chain, model, keep_matmuls=True)}
    best = {}
    for _ in range(rounds):
        for kind, c in kinds.items():
            secs = [cost.seconds for cost in profile(model, c, x, y, repeats=3, reuse=True)]
            best[kind] = [min(a, b) for a, b in zip(best[kind], secs)] if kind in best else secs
    return [{k: max(best[k][i] / base - 1, 0.0) if base > 0 else 0.0 for k in ("layers", "selective")}
            for i, base in enumerate(best["none"])]


def report(case: str, name: str, runs: list) -> None:
    ts = [t for t, _ in runs]
    print(f"{case:15s} {name:6s} seconds median {statistics.median(ts):.2f} (min {min(ts):.2f}, max {max(ts):.2f})")
    for i in range(len(runs[0][1])):
        for k in ("layers", "selective"):
            v = [s[i][k] for _, s in runs]
            if max(v) > 0:
                q = statistics.quantiles(v, n=4)
                print(f"    layer {i} {k:9s} median {statistics.median(v):.3f}  range {min(v):.3f}-{max(v):.3f}  "
                      f"iqr {q[2] - q[0]:.3f}")


def main(n: int, out_json: str) -> None:
    torch.set_num_threads(1)  # as a worker runs, and as the planner profiles
    cases = {"default": [], **{m: [*MODELS[m], *COMMON] for m in MODELS}}
    res = {}
    for case, overrides in cases.items():
        job = job_of(load_config(None, overrides))
        torch.manual_seed(0)
        model = job.build()
        chain = chain_of(model)
        x, y = job.batch(job.settings.global_batch, 1)
        out = {"before": [], "after": []}
        with job.settings.autocast():
            for i in range(n):
                for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    fn = before if name == "before" else prof._recompute_shares
                    t0 = time.perf_counter()
                    shares = fn(model, chain, x, y)
                    out[name].append((time.perf_counter() - t0, shares))
        res[case] = out
        for name, runs in out.items():
            report(case, name, runs)
        sys.stdout.flush()
    with open(out_json, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 2:
        sys.exit("usage: shares.py N OUT_JSON, N >= 2 profiles of each kind per model (a spread needs two)")
    main(int(sys.argv[1]), sys.argv[2])
