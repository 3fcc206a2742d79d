"""Price a saved `tessel bench plan` run twice on one fresh profile per model: as the planner prices now, and with
the two compute fixes of 2026-11-29 switched off (a tensor-parallel rank's layers as the plain layer over tp instead
of timed on stand-in groups; recompute at its kind's assumed share instead of the profile's measured one). Both
columns share the profile, so their difference is the fixes, not a second profile's drift.

    python bench/plan/paired_reprice.py bench/plan > bench/plan/paired-reprice.txt

With a git revision as a second argument, "before" is that revision's estimate (``tessel/planner/estimate.py`` as
committed there, loaded beside today's) on the same profile instead:

    python bench/plan/paired_reprice.py bench/plan 90ce773
"""

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

from scipy.stats import spearmanr

from tessel.bench.plan_check import COMMON, MODELS
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import Topology
from tessel.planner.choose import choose
from tessel.planner.estimate import estimate
from tessel.planner.profile import Profile
from tessel.resolve import job_of, policy_of, settings_of


def without_fixes(plan, settings, profile, topo) -> float:
    timed, shares = Profile.tp_seconds, [layer.again for layer in profile.layers]
    Profile.tp_seconds = lambda self, *a: None
    for layer in profile.layers:
        layer.again = {}
    try:
        return estimate(plan, settings, profile, topo).step
    finally:
        Profile.tp_seconds = timed
        for layer, share in zip(profile.layers, shares):
            layer.again = share


def at_revision(rev: str):
    """The ``estimate`` function of ``tessel/planner/estimate.py`` as committed at ``rev``, importing today's
    package around it (its relative imports resolve in ``tessel.planner``)."""
    source = subprocess.run(["git", "show", f"{rev}:src/tessel/planner/estimate.py"], check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("tessel.planner._estimate_then", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "tessel.planner"
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    exec(compile(source, f"{rev}:estimate.py", "exec"), module.__dict__)
    return lambda plan, settings, profile, topo: module.estimate(plan, settings, profile, topo).step


def main(out: Path, rev: str | None = None) -> None:
    before_of = at_revision(rev) if rev else without_fixes
    rows = json.loads((out / "results.json").read_text())["rows"]
    profiles, cells = {}, {}
    for r in rows:
        cfg = load_config(None, [*MODELS[r["model"]], *COMMON])
        topo = Topology(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6,
                        latency=r["latency"], speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"],
                        per_micro=r.get("per_micro", 0.0))
        if r["model"] not in profiles:  # profiled at every candidate's micro-batch size, as planning does
            profiles[r["model"]] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
        name = f"{r['model']}-h{r['hosts']}-{r['rate']}/{r['plan'].replace(' ', '-')}.json"
        plan = ParallelPlan.from_json((out / "plans" / name).read_text()).with_(sparse=policy_of(cfg))
        settings, profile = settings_of(cfg), profiles[r["model"]]
        before, after = before_of(plan, settings, profile, topo), estimate(plan, settings, profile, topo).step
        cells.setdefault((r["model"], r["hosts"], r["rate"]), []).append((r, before, after))
    every = {0: [], 1: []}
    for (model, hosts, rate), got in cells.items():
        measured = [r["measured"] for r, *_ in got]
        line = f"{model}, {hosts} hosts, {rate}"
        for k, label in ((1, "before"), (2, "after")):
            errors = [abs(g[k] / g[0]["measured"] - 1) for g in got]
            every[k - 1] += errors
            rho = spearmanr([g[k] for g in got], measured).statistic
            pick = min(got, key=lambda g: g[k])[0]
            line += (f" | {label}: {statistics.median(errors):.0%} / {max(errors):.0%} / {rho:.2f} / "
                     f"{pick['measured'] / min(measured):.2f}x ({pick['plan']})")
        print(line)
    for k, label in ((0, "before"), (1, "after")):
        print(f"all cells, {label}: median {statistics.median(every[k]):.0%}, worst {max(every[k]):.0%}, "
              f"{len(every[k])} candidates")
    flat = [g for got in cells.values() for g in got]
    for title, shown in (("largest errors after:", sorted(flat, key=lambda g: -abs(g[2] / g[0]["measured"] - 1))[:8]),
                         ("sharded (FSDP) candidates:", [g for g in flat if "fsdp" in g[0]["plan"]])):
        print(title)
        show(shown)


def show(got) -> None:
    for r, before, after in got:
        print(f"  {r['model']}, {r['hosts']} hosts, {r['rate']}, {r['plan']}: measured {r['measured'] * 1e3:.0f} ms, "
              f"before {before * 1e3:.0f} ({before / r['measured'] - 1:+.0%}), after {after * 1e3:.0f} "
              f"({after / r['measured'] - 1:+.0%})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
