"""The 17 saved 3-round planner cells priced twice on one fresh profile per model: as the planner prices now, and
with a flushed pipeline's fill and drain (the first micro-batch's slot on every stage) priced at the CFS budget a
host has after idling: each stage's forward and backward of that micro-batch is a burst of w seconds at a full core
that takes min(w, q) + max(0, w - q) / speed, with q = 10 ms x the host's quota (2 cores / hosts, as the bench's
hosts have). An experiment beside the estimate (its _pipeline replaced for the second pricing), not a change to it.
It ran at commit 08fe948; from 9a5b5f9 the schedule arithmetic is tessel.planner.span.pipeline, with another
signature, so check that commit out to run it again.

    python bench/local-probes/burst-2026-12-01/reprice_burst.py > bench/local-probes/burst-2026-12-01/reprice.txt
    python bench/local-probes/burst-2026-12-01/reprice_burst.py 0.00396 > bench/local-probes/burst-2026-12-01/reprice-m.txt
"""
import dataclasses, json, statistics, sys
from pathlib import Path

from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stage-2026-11-30"))
from cells import CELLS  # noqa: E402

from tessel.bench.plan_check import COMMON, MODELS  # noqa: E402
from tessel.cluster.emulate import parse_rate  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402
from tessel.planner import Topology  # noqa: E402
from tessel.planner import estimate as est  # noqa: E402
from tessel.planner.choose import choose  # noqa: E402
from tessel.resolve import job_of, policy_of, settings_of  # noqa: E402

CELLS = {**CELLS, **{(m, 3, "300mbit"): "plan-unseen-3h" for m in ("classifier", "lstm_lm", "transformer_lm")}}
PERIOD = 0.010
# with an argument: also the runtime's per-micro-batch CPU a local stage spends beyond its layers (3.96 ms at a full
# core, docs/benchmarks.md "A pipeline stage's time, paired by round"), at the host's speed, on pipelined plans
STAGE_MICRO = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
plain = est._pipeline
now = {}


def budgeted(plan, compute, work, send, hops):
    m = plan.micro_batches
    if not (plan.pp > 1 and plan.schedule.flushed):
        return plain(plan, compute, work, send, hops)
    f, q = now["speed"], now["budget"]
    burst = lambda w: min(w, q) + max(0.0, w - q) / f  # noqa: E731
    slots = [max(w, s) + lat for w, (s, lat) in zip(work, send)]
    fill = sum(sl - c + burst(c * f / 3) + burst(2 * c * f / 3) for c, sl in zip(compute, slots))
    span = fill + (m - 1) * max(slots)
    comm = (max(slots) - max(compute)) * m
    return comm, span - max(compute) * m - comm + sum(hops)


def main() -> None:
    root = Path(__file__).resolve().parents[2]
    profiles, cells = {}, {}
    for (model, hosts, rate), folder in CELLS.items():
        rows = [r for r in json.loads((root / folder / "results.json").read_text())["rows"]
                if (r["model"], r["hosts"], r["rate"]) == (model, hosts, rate)]
        for r in rows:
            cfg = load_config(None, [*MODELS[model], *COMMON])
            topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                            speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"],
                            per_micro=r.get("per_micro", 0.0))
            if model not in profiles:
                profiles[model] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
            name = f"{model}-h{hosts}-{rate}/{r['plan'].replace(' ', '-')}.json"
            plan = ParallelPlan.from_json((root / folder / "plans" / name).read_text()).with_(sparse=policy_of(cfg))
            settings = settings_of(cfg)
            before = est.estimate(plan, settings, profiles[model], topo).step
            now.update(speed=topo.speed, budget=PERIOD * 2 / hosts)
            est._pipeline = budgeted
            if STAGE_MICRO and plan.pp > 1:
                topo = dataclasses.replace(topo, per_micro=topo.per_micro + STAGE_MICRO / topo.speed)
            try:
                after = est.estimate(plan, settings, profiles[model], topo).step
            finally:
                est._pipeline = plain
            cells.setdefault((model, hosts, rate), []).append((r, before, after))
    every = {1: [], 2: []}
    for (model, hosts, rate), got in cells.items():
        measured = [g[0]["measured"] for g in got]
        line = f"{model}, {hosts} hosts, {rate}"
        for k, label in ((1, "now"), (2, "budget")):
            errors = [abs(g[k] / g[0]["measured"] - 1) for g in got]
            every[k] += errors
            rho = spearmanr([g[k] for g in got], measured).statistic
            line += f" | {label}: {statistics.median(errors):.0%} / {max(errors):.0%} / {rho:.2f}"
        print(line)
    for k, label in ((1, "now"), (2, "budget")):
        print(f"all cells, {label}: median {statistics.median(every[k]):.0%}, worst {max(every[k]):.0%}, "
              f"{len(every[k])} candidates")


if __name__ == "__main__":
    main()
