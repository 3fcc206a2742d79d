"""Stage 0 of the pipeline scenario's classifier at pp4 m4 under async-predict v1 (stage0.py's step), one process:
CPU ms per step with the forwards' Ŵ shared (this commit) and made per forward (sharing defeated), alternating,
median of 10 steps per round."""
import statistics, sys, time
from stage0 import Stage
from tessel.bench.stats import paired_ratio

stage, res = Stage("classifier"), {True: [], False: []}
for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    for share in ((True, False) if rd % 2 == 0 else (False, True)):
        ts = []
        for _ in range(13):
            c = time.thread_time(); stage.step(share); ts.append(time.thread_time() - c)
        res[share].append(statistics.median(ts[3:]) * 1e3)
print("shared", [round(v, 1) for v in res[True]]); print("per forward", [round(v, 1) for v in res[False]])
print("per-forward over shared:", paired_ratio(dict(enumerate(res[False])), dict(enumerate(res[True]))),
      "median saved ms", round(statistics.median(a - b for a, b in zip(res[False], res[True])), 2))
