"""What recomputing each layer adds, by micro-batch size: each of `tessel bench plan`'s models' layers timed plain
and recomputed (every layer, as `--recompute layers` runs it) at 1, 2, 4, 8, 16 and 32 samples, 7 rounds a size
in alternating order, one thread; per layer the median plain time and the median of each round's added time (ms).
Then the added time at 2-16 samples on the line through 1 and 32 (what LayerProfile.again_at prices where the
profile timed those two sizes).

    python bench/plan-recompute/lines.py lstm_lm transformer_lm classifier > bench/plan-recompute/lines.txt
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common

from reprice_common import built  # noqa: E402

from tessel.chain import recomputed
from tessel.planner.profile import profile

SIZES = (1, 2, 4, 8, 16, 32)
for name in sys.argv[1:]:
    job, model, chain, x, y = built(name)
    kinds = {"none": chain, "layers": recomputed(chain, model)}
    added_at = {}
    for n in SIZES:
        secs = {k: [] for k in kinds}
        for r in range(7):
            for k in kinds if r % 2 == 0 else list(kinds)[::-1]:
                secs[k].append([c.seconds for c in profile(model, kinds[k], x[:n], y[:n], repeats=1, reuse=True,
                                                           warm=r == 0)])
        layers = range(len(chain.layers))
        base = [statistics.median(run[i] for run in secs["none"]) for i in layers]
        added_at[n] = [statistics.median(a[i] - b[i] for a, b in zip(secs["layers"], secs["none"])) for i in layers]
        share = [round(a / b, 2) for a, b in zip(added_at[n], base)]
        print(f"{name} {n:2d} samples: plain ms {[round(1e3 * t, 2) for t in base]}, recompute adds ms "
              f"{[round(1e3 * t, 2) for t in added_at[n]]}, share {share}", flush=True)
    for n in SIZES[1:-1]:
        lo, hi = SIZES[0], SIZES[-1]
        line = [a + (c - a) * (n - lo) / (hi - lo) for a, c in zip(added_at[lo], added_at[hi])]
        print(f"{name} {n:2d} samples: on the line through 1 and 32, adds ms {[round(1e3 * t, 2) for t in line]}")
