"""Over every saved 3-round planner cell: each pipeline stage's CPU a step (the runs' summaries, process time, median
over rounds and over the stage's ranks) less its layers' and optimizer's price at speed 1 (one fresh profile per
model), per micro-batch: the CPU a stage spends per micro-batch beyond what the profile times, against the tp
collectives' ring steps it runs per micro-batch (the estimate's count). FSDP plans are left out (their gathers'
CPU is a cost of its own). Writes beyond.json; prints a line per stage and a least-squares fit."""
import glob
import json
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "stage-2026-11-30"))
from cells import CELLS  # noqa: E402

from tessel.bench.plan_check import COMMON, MODELS, _saved  # noqa: E402
from tessel.cluster.emulate import parse_rate  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402
from tessel.planner import Topology  # noqa: E402
from tessel.planner.estimate import _layer_seconds, _tp_traffic  # noqa: E402
from tessel.planner.weights import dense  # noqa: E402
from tessel.planner.profile import measure  # noqa: E402
from tessel.resolve import job_of, settings_of  # noqa: E402

CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")},
         **{(m, 6, "200mbit"): "plan-unseen-6h-200" for m in ("classifier", "transformer_lm")},
         **{(m, 2, "100mbit"): "plan-unseen-2h-100" for m in ("classifier", "lstm_lm", "transformer_lm")}}
BENCH = HERE.parents[2]
out, profiles = [], {}
for (model, hosts, rate), folder in sorted(CELLS.items()):
    d = BENCH / folder
    cfg = load_config(None, [*MODELS[model], *COMMON])
    settings, b = settings_of(cfg), cfg.train.global_batch
    rows = [r for r in _saved(d)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate
            and r.get("measured")]
    plans = {r["plan"]: ParallelPlan.from_json((d / "plans" / f"{model}-h{hosts}-{rate}" /
                                                f"{r['plan'].replace(' ', '-')}.json").read_text()) for r in rows}
    if model not in profiles:
        profiles[model] = measure(job_of(cfg), sizes=(1, 2, 4, 8, 16, 32, 64), dps=(1, 2, 4, 8))
    profile = profiles[model]
    for r in rows:
        plan = plans[r["plan"]]
        if plan.pp == 1 or plan.dp_shard > 1:
            continue
        topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                        speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"])
        m = plan.micro_batches
        samples = b / (plan.dp * m)
        layer = [t * profile.step_factor * (1 + (lp.again.get(plan.recompute.name, plan.recompute.again)
                                                 if plan.recompute.layers else 0.0))
                 for t, lp in zip(_layer_seconds(plan, profile, samples), profile.layers)]
        runs = sorted(glob.glob(str(d / f"{model}-h{hosts}-{rate}" / "runs" /
                                    f"{model}-{r['plan'].replace(' ', '-')}-h{hosts}-{rate}-r*" / "summary.json")))
        pipes = [json.load(open(f))["pipeline"] for f in runs]
        for k, (lo, hi) in enumerate(plan.bounds):
            per_run = [[c for c, s in zip(p["cpu_per_step_per_rank"], p["stage_of_rank"]) if s == k and c]
                       for p in pipes]
            per_run = [statistics.median(x) for x in per_run if x]
            if not per_run:  # (a run that kept no stage summary)
                continue
            cpu = statistics.median(per_run)
            opt = sum(dense(profile, plan, lo, hi, set())) * profile.optimizer_per_elem * profile.step_factor
            _, _, s_tp = _tp_traffic(plan, profile, range(lo, hi), samples * profile.tokens_per_sample,
                                  topo, settings.wire_dtype.itemsize)
            steps = round(s_tp / topo.latency) if plan.tp > 1 else 0  # (bytes' time is a small part at these sizes)
            layers = sum(layer[lo:hi])
            beyond = cpu - opt - layers * m  # a step's
            out.append(dict(cell=f"{model} {hosts}h {rate}", plan=r["plan"], stage=k, m=m, dp=plan.dp, tp=plan.tp,
                            cpu=cpu, layers=layers, opt=opt, steps=steps, beyond=beyond, speed=r["speed"],
                            nlayers=hi - lo))
            print(f"{model[:6]} {hosts}h {rate:8s} {r['plan']:42s} s{k} m{m} cpu {cpu * 1e3:6.1f} layers/mb "
                  f"{layers * 1e3:5.2f} opt {opt * 1e3:5.1f} tp-steps/mb {steps:3d} beyond/step {beyond * 1e3:6.2f}")
(HERE.parent / "beyond.json").write_text(json.dumps(out, indent=1))
for sel, label in ((lambda x: x["dp"] == 1, "dp1"), (lambda x: True, "all"),
                   (lambda x: x["dp"] == 1 and x["speed"] > 0.9, "dp1 whole-core hosts"),
                   (lambda x: x["dp"] == 1 and x["speed"] < 0.9, "dp1 fractional hosts")):
    xs = [x for x in out if sel(x)]
    A = np.array([[1.0, x["m"], x["m"] * x["steps"]] for x in xs])
    y = np.array([x["beyond"] for x in xs])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    res = y - A @ coef
    print(f"{label}: {len(xs)} stages; CPU a step beyond layers and optimizer = {coef[0] * 1e3:.2f} ms + "
          f"{coef[1] * 1e3:.2f} ms a micro-batch + {coef[2] * 1e3:.3f} ms per tp ring step; residual median "
          f"|{np.median(abs(res)) * 1e3:.2f}| ms (beyond's median {np.median(abs(y)) * 1e3:.2f})")
