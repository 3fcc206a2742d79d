"""paired ratio by round: NUM strategy's median step over DEN's, per model, from a bench out folder; and the
stages' CPU per step (median over rounds)"""
import json, sys, statistics
from pathlib import Path
from tessel.bench.stats import paired_ratio
out, num, den = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
for model in ("classifier", "transformer_lm"):
    t = {}
    cpu = {}
    for s in (num, den):
        t[s], cpu[s] = {}, []
        for d in sorted(out.glob(f"runs/{model}-{s}-h4-1gbit-r*")):
            sm = json.loads((d / "summary.json").read_text())
            t[s][int(d.name.rsplit("-r", 1)[1])] = sm["median_step_time"]
            cpu[s].append(sm["pipeline"]["cpu_per_step_per_rank"])
    r = paired_ratio(t[den], t[num])
    print(model, f"{den} over {num}:", r, "per round", [round(t[den][k] / t[num][k], 2) for k in sorted(t[num])])
    for s in (num, den):
        print("   cpu ms/step per stage", s, [round(statistics.median(c[i] for c in cpu[s]) * 1e3, 1) for i in range(4)])
