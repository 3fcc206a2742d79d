"""``tessel bench SCENARIO``: strategies side by side on emulated hosts, with the physical bound.

    tessel bench ddp                                   # 1, 2, 4 hosts at 1 Gbit/s and 200 Mbit/s, 3 repeats
    tessel bench ddp --hosts 4 --rates 1gbit --models classifier --repeats 2 --doc docs/benchmarks.md
    tessel bench sparse --models classifier --strategies dense,ps --hosts 4 --append   # add runs to bench/sparse
    tessel bench ddp --report-only --doc docs/benchmarks.md                          # re-render, run nothing
    tessel bench pipeline --repeats 2 --steps 16 --doc docs/benchmarks.md   # 4 stages vs DDP and torch's schedules
    tessel bench plan --report-only --reprice --doc docs/benchmarks.md   # today's planner against saved runs
    tessel bench pipeline --models classifier --rates 50mbit --compute-only   # at the balanced link, with efficiency
    tessel bench drift --seconds 120 --doc docs/benchmarks.md   # the spread the machine alone gives a run
    tessel bench soak --steps 5000 --doc docs/benchmarks.md     # does memory stay flat over a long run?
    tessel bench memory --repeats 2 --doc docs/benchmarks.md   # the largest model each plan trains per host limit
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..errors import ConfigError
from . import scenarios


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark strategies side by side on an emulated cluster", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # keep the example commands one per line
    p.add_argument("scenario", help=f"one of: {', '.join(scenarios.SCENARIOS)}, plan, drift, soak, memory")
    p.add_argument("--hosts", help="comma-separated host counts (default 1,2,4)")
    p.add_argument("--rates", help="comma-separated link rates (default 1gbit,200mbit)")
    p.add_argument("--models", help="comma-separated subset of the scenario's models")
    p.add_argument("--strategies", help="comma-separated subset of the scenario's strategies")
    p.add_argument("--steps", type=int, help="training steps per run (default 12)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each job, in alternating order (default 3)")
    p.add_argument("--out", help="folder for results.json, report.md and plots (default bench/SCENARIO)")
    p.add_argument("--append", action="store_true",
                   help="keep the runs already in OUT/results.json that this invocation does not redo")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild report.md, plots (and --doc) from OUT/results.json")
    p.add_argument("--compute-only", action="store_true",
                   help="also run each host count > 1 on unshaped links, for the scenarios that do not by default "
                        "(pipeline, tensor, compose, tables-*): their compute-only time, balanced link and efficiency")
    p.add_argument("--timing-only", action="store_true",
                   help="memory only: keep OUT/results.json's searches and time again, at their common depth, the "
                        "plans --strategies names (default all it holds), --repeats rounds in alternating order")
    p.add_argument("--reprice", action="store_true",
                   help="plan only, with --report-only: price the saved candidates again with the planner as it is "
                        "now (a fresh profile, each cell's saved topology) against the run's measurements")
    p.add_argument("--trial", action="store_true",
                   help="plan only: run the planner's calibration trial of each model on each cell and price with it "
                        "(tessel.planner.calibrate); the report also prices the same runs with the probe alone")
    p.add_argument("--cpus", type=float, help="CPU budget of each host in cores (default: cores / hosts)")
    p.add_argument("--cpu-period", type=float, default=10.0,
                   help="CFS period of each host's CPU quota in ms, 1 to 1000 (default 10)")
    p.add_argument("--cpu-burst", type=float, default=0.0,
                   help="unused quota a host may carry into a later period, in ms (cpu.cfs_burst_us; default 0)")
    p.add_argument("--pin", action="store_true", help="pin host i to core i mod cores (a cpuset per host)")
    p.add_argument("--nic-cpu", type=float, default=0.0,
                   help="give each host a NIC: gloo's communication threads get a CPU budget of their own, this "
                        "many cores per host, taken from the hosts' default budget (default 0: none)")
    p.add_argument("--seconds", type=float, default=120.0,
                   help="drift only: how long the fixed workload runs on every core (default 120)")
    p.add_argument("--doc", help="also replace this scenario's section of a Markdown file, e.g. docs/benchmarks.md")


def _subset(name: str, given: str | None, valid: dict) -> dict:
    if not given:
        return valid
    keys = [k.strip() for k in given.split(",") if k.strip()]
    bad = [k for k in keys if k not in valid]
    if bad:
        raise ConfigError(f"--{name} {','.join(bad)} not in this scenario; valid: {', '.join(valid)}")
    return {k: valid[k] for k in keys}


def _check_paths(out: Path, doc: str | None) -> None:
    """Before any run: the results folder can be made and written, and --doc's folder exists."""
    page = Path(doc) if doc else None
    if page and (page.is_dir() or not page.parent.is_dir()):  # found now, not after the whole benchmark has run
        why = "it is a folder" if page.is_dir() else f"folder '{page.parent}' does not exist"
        raise ConfigError(f"--doc '{doc}': {why}; give a Markdown file in an existing folder, e.g. docs/benchmarks.md")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out '{out}' is a file; give a folder for results.json, report.md and plots")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out '{out}' cannot be created ({e.strerror or type(e).__name__}); give a folder "
                          "you may write in") from None


def _cpu(ns) -> dict:
    """The emulated hosts' CPU settings, checked before any run."""
    import math

    if not (math.isfinite(ns.cpu_period) and 1 <= ns.cpu_period <= 1000):
        raise ConfigError(f"--cpu-period {ns.cpu_period:g} must be a number of ms from 1 to 1000, e.g. 10")
    if not (math.isfinite(ns.cpu_burst) and 0 <= ns.cpu_burst <= ns.cpu_period):
        raise ConfigError(f"--cpu-burst {ns.cpu_burst:g} must be a number of ms from 0 to the period "
                          f"({ns.cpu_period:g}), e.g. 2")
    if ns.cpus is not None and not (math.isfinite(ns.cpus) and ns.cpus > 0):
        raise ConfigError(f"--cpus {ns.cpus:g} must be a positive number of cores per host, e.g. 0.4")
    cpus = {"cpus": ns.cpus} if ns.cpus is not None else {}
    if not (math.isfinite(ns.nic_cpu) and ns.nic_cpu >= 0):
        raise ConfigError(f"--nic-cpu {ns.nic_cpu:g} must be 0 or a positive number of cores per host, e.g. 0.1")
    nic = {"nic_cpus": ns.nic_cpu} if ns.nic_cpu else {}
    return {**cpus, **nic, "period_us": round(ns.cpu_period * 1000), "burst_us": round(ns.cpu_burst * 1000),
            "pin": ns.pin}


def _check_extras() -> None:
    """Before any run: the report's plots and intervals need matplotlib and scipy (the 'bench' extra)."""
    import importlib.util

    missing = [m for m in ("matplotlib", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"tessel bench needs {' and '.join(missing)} for its report; install them with "
                          "pip install -c constraints-cpu.txt 'tessel[bench]'")


def _read_results(saved: Path) -> dict:
    try:
        prev = json.loads(saved.read_text())
        if not isinstance(prev, dict) or not isinstance(prev.get("runs"), list):
            raise ValueError("no list of runs")
        return prev
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{saved} is not a results file tessel wrote ({str(e)[:80]}); move it away or run "
                          "without --append / --report-only") from None


def main(ns, argv: list[str]) -> int:
    from .report import UNSHAPED, write
    from .runner import fill_step_times, run_scenario

    _check_extras()
    if ns.reprice and not (ns.scenario == "plan" and ns.report_only):
        raise ConfigError("--reprice re-prices a saved planner check: use it with 'plan --report-only'")
    if ns.timing_only and (ns.scenario != "memory" or ns.report_only or ns.append):
        raise ConfigError("--timing-only times a saved memory search again: use it with 'memory', without "
                          "--report-only or --append")
    if ns.scenario == "plan":  # the planner's predictions against measurement (its own cells and report)
        from . import plan_check

        return plan_check.main(ns, argv)
    if ns.scenario == "drift":  # the machine alone, no cluster (its own report)
        from . import drift

        return drift.main(ns, argv, _check_paths)
    if ns.scenario == "soak":  # one long run per table strategy, memory sampled (its own report)
        from . import soak

        return soak.main(ns, argv, _check_paths)
    if ns.scenario == "memory":  # the largest model each plan trains under a host memory limit (its own report)
        from . import fit

        return fit.main(ns, argv, _check_paths)
    scn = scenarios.get(ns.scenario)
    scn.cluster = _cpu(ns)
    scn.unshaped = scn.unshaped or ns.compute_only
    if ns.hosts:
        try:
            scn.hosts = sorted({int(h) for h in ns.hosts.split(",")})
        except ValueError:
            raise ConfigError(f"--hosts '{ns.hosts}' must be comma-separated integers, e.g. 1,2,4") from None
        if min(scn.hosts) < 1:
            raise ConfigError("--hosts values must be >= 1")
    if ns.rates:
        from ..cluster.emulate import parse_rate

        scn.rates = [r.strip() for r in ns.rates.split(",")]
        for r in scn.rates:
            parse_rate(r)
    scn.models = _subset("models", ns.models, scn.models)
    scn.strategies = _subset("strategies", ns.strategies, scn.strategies)
    if scn.baseline not in scn.strategies:
        scn.baseline = next(iter(scn.strategies))
    if ns.steps:
        if ns.steps < 5:
            raise ConfigError("--steps must be >= 5 (3 warm-up steps are left out of the medians)")
        scn.steps = ns.steps
    if ns.repeats < 1:
        raise ConfigError("--repeats must be >= 1")
    out = Path(ns.out or f"bench/{scn.name}")
    _check_paths(out, ns.doc)
    saved = out / "results.json"
    prev = _read_results(saved) if (ns.append or ns.report_only) and saved.is_file() else None
    if ns.report_only and prev is None:
        from .runner import records_from_runs

        found = records_from_runs(out)  # an interrupted benchmark left its finished runs behind
        if not found:
            raise ConfigError(f"--report-only needs {saved} or finished runs under {out / 'runs'}; "
                              "run the benchmark first")
        prev = {"runs": found, "commands": [], "environment": {}}
    records = [] if ns.report_only else run_scenario(scn, out, ns.repeats)
    if prev:
        fill_step_times(prev["runs"], out)
    commands = prev.get("commands", []) if prev else []
    if not ns.report_only:
        commands.append("tessel " + " ".join(shlex.quote(a) for a in argv))
    if prev:
        key = lambda r: (r["model"], r["strategy"], r["hosts"], r["rate"])  # noqa: E731
        redone = {key(r) for r in records}
        records = [r for r in prev["runs"] if key(r) not in redone] + records
        full = scenarios.get(ns.scenario)
        scn.hosts = sorted({r["hosts"] for r in records})
        scn.models = {m: f for m, f in full.models.items() if m in {r["model"] for r in records}}
        scn.strategies = {s: f for s, f in full.strategies.items() if s in {r["strategy"] for r in records}}
        ran = list(dict.fromkeys(x["rate"] for x in records if x["rate"] != UNSHAPED))
        # the scenario's own rates in its order, then any a --rates run added (50mbit on the sparse scenario)
        scn.rates = [r for r in full.rates if r in ran] + [r for r in ran if r not in full.rates] or scn.rates
        scn.steps = prev["environment"].get("steps_per_run", scn.steps) if ns.report_only else scn.steps
        scn.cluster = prev["environment"].get("cluster", scn.cluster) if ns.report_only else scn.cluster
        # the scenario's baseline where it ran, else the first strategy that did (as a --strategies run chose)
        scn.baseline = full.baseline if full.baseline in scn.strategies else next(iter(scn.strategies))
    repeats = max(r["repeat"] for r in records) + 1
    saved_env = prev.get("environment") if ns.report_only and prev else None  # the runs' machine, not today's
    print(write(records, scn, out, repeats, commands, Path(ns.doc) if ns.doc else None, saved_env))
    print(f"results.json, report.md and plots in {out}", file=sys.stderr)
    return 0
