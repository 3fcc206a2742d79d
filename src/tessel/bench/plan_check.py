"""``tessel bench plan``: the planner's predictions against measurement on the emulated cluster.

For every (hosts, link rate) cell and reference model the planner ranks the candidates on that cell's
topology (the hosts' CPU budget as compute speed, the shaped link rate); its top 3 and an even spread of
5 others are saved as plan files and run side by side (``--plan FILE``, alternating order over rounds),
so every run follows exactly the plan that was predicted. Reported per cell: predicted against measured
median step time, the error of each, their Spearman rank correlation, whether the planner's pick is within
10% of the best measured candidate (judged on the interval of their ratio paired by round, so at least 3
rounds; see ``judge_pick``), and whether the predicted bytes of dp.dense, pp, tp and every tp.* channel equal the
counted bytes of the busiest rank; a scatter plot of predicted against measured over every cell. The run before
is kept as ``results-previous.json`` and its headline printed under the new one's.

    tessel bench plan --hosts 4,8 --rates 1gbit,200mbit --repeats 3 --doc docs/benchmarks.md
"""

from __future__ import annotations

import json
import statistics
import time
from functools import partial
from pathlib import Path

from ..config import load_config
from ..errors import PlanError
from ..planner import Planned, calibrate, choose, short, topology
from ..planner.estimate import estimate
from ..planner.topology import Topology
from ..resolve import job_of, policy_of, settings_of
from .report import update_doc
from .runner import run_scenario
from .scenarios import Scenario
from .stats import Ratio, paired_ratio

SLACK = 1.10  # the pick should be within 10% of the best measured candidate
PREVIOUS = "results-previous.json"  # the run before the last, kept for comparison
# and every tp.* channel (head and loss, token table, norms, gradient sums); FSDP's three since 2026-12-07's fourth
# session (runs before it compared the first three and tp.* only)
EXACT = ("dp.dense", "dp.gather", "dp.scatter", "dp.replicate", "pp", "tp")

# The three reference models at sizes a run on 2 cores finishes in seconds per step (config overrides).
MODELS = {
    "transformer_lm": ["model.name=transformer_lm", "model.layers=4", "model.dim=128", "data.vocab_size=4096",
                       "data.seq_len=32", "train.global_batch=32", "sparse.strategy=dense"],
    "classifier": ["model.name=classifier", "model.layers=4", "model.hidden=1024", "model.in_features=1024",
                   "train.global_batch=64"],
    "lstm_lm": ["model.name=lstm_lm", "model.dim=64", "model.hidden=256", "data.vocab_size=4096", "data.seq_len=32",
                "train.global_batch=32", "sparse.strategy=dense"],
}
COMMON = ["train.optimizer=sgd", "train.lr=0.01", "parallel.timeout=120", "metrics.progress=log",
          "metrics.plot=false", "checkpoint.enabled=false"]


def _flags(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in (f"--{o.split('=', 1)[0]}", o.split("=", 1)[1])]


def pick(planned: Planned, top: int = 3, others: int = 5) -> list:
    """The planner's top ``top`` and ``others`` more spread evenly over the rest of the ranking, one per shape
    (dp, pp, tp, mode) where the ranking allows, so the check covers every kind of plan."""
    chosen = planned.ranked[:top]
    rest = planned.ranked[top:]
    shapes = {(e.plan.dp, e.plan.pp, e.plan.tp, e.plan.tp_mode) for e in chosen}
    fresh = [e for e in rest if (e.plan.dp, e.plan.pp, e.plan.tp, e.plan.tp_mode) not in shapes]
    seen, varied = set(), []
    for e in fresh:
        key = (e.plan.dp, e.plan.pp, e.plan.tp, e.plan.tp_mode)
        if key not in seen:
            seen.add(key)
            varied.append(e)
    pool = varied if len(varied) >= others else varied + [e for e in rest if e not in varied]
    idx = sorted({round(i * (len(pool) - 1) / max(others - 1, 1)) for i in range(min(others, len(pool)))})
    return chosen + [pool[i] for i in idx]


def probe_cell(hosts: int, rate: str, cluster: dict) -> dict:
    """The probe (tessel.planner.probe) on a cluster like the cell's: latency under load, speed and rate per rank."""
    from ..cluster.emulate import EmulatedCluster

    with EmulatedCluster(hosts, rate=rate, prefix="tspp", **cluster) as emu:
        res = emu.run(emu.torchrun_commands(["-m", "tessel.planner.probe"], run_id="probe"), timeout=300)
    return json.loads(res[0].stdout.strip().splitlines()[-1])


def trial_cell(model: str, hosts: int, rate: str, cluster: dict) -> dict:
    """The calibration trial (tessel.planner.calibrate) of ``model`` on a cluster like the cell's."""
    from ..cluster.emulate import EmulatedCluster

    with EmulatedCluster(hosts, rate=rate, prefix="tspt", **cluster) as emu:
        args = ["-m", "tessel.trial", *MODELS[model], *COMMON]
        res = emu.run(emu.torchrun_commands(args, run_id="trial"), timeout=300)
    return json.loads(res[0].stdout.strip().splitlines()[-1])


def _cell(model: str, hosts: int, rate: str, cpus: float, out: Path, measured: dict, trial: dict | None
          ) -> tuple[Planned, list, Scenario, Topology]:
    """(the plan, the candidates picked to run, their scenario, the probe's topology): with a trial the
    planner prices on its calibration, and the probe's topology is kept to price the same runs without it."""
    from ..cluster.emulate import parse_rate

    cfg = load_config(None, [*MODELS[model], *COMMON])
    probed = topology.probed(Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6,
                                      speed=min(1.0, cpus)), measured,
                             "emulated cluster, latency, speed, rate, overlap, waits and quota probed")
    planned = calibrate.choose_calibrated(job_of(cfg), lambda cal: cal.apply(probed) if cal else probed, trial,
                                          cfg.plan.allow_async)
    best = planned.best  # (no plan fits: a PlanError saying why, which skips the cell)
    picked = pick(planned)
    folder = out / "plans" / f"{model}-h{hosts}-{rate}"
    folder.mkdir(parents=True, exist_ok=True)
    strategies = {}
    for e in picked:
        label = short(e.plan).replace(" ", "-")
        path = folder / f"{label}.json"
        path.write_text(e.plan.to_json())
        strategies[label] = ["--plan", str(path.resolve())]
    scn = Scenario(name="plan", about="planner check", models={model: _flags(MODELS[model])}, strategies=strategies,
                   baseline=short(best.plan).replace(" ", "-"), hosts=[hosts], rates=[rate], unshaped=False,
                   common=_flags(COMMON), cluster={"cpus": cpus})
    return planned, picked, scn, probed


def run(models: list[str], hosts: list[int], rates: list[str], out: Path, repeats: int, steps: int,
        cluster: dict, trial: bool = False, save=lambda rows: None) -> list[dict]:
    """Every cell: plan, run the picked candidates, compare; returns one row per candidate, and hands the rows so
    far to ``save`` after every cell (a run stopped part-way keeps the cells it finished)."""
    import os

    rows = []
    for h in hosts:
        cpus = cluster.get("cpus") or (os.cpu_count() or 1) / h
        for rate in rates:
            measured = probe_cell(h, rate, {**cluster, "cpus": cpus})
            print(f"probe, {h} hosts, {rate}: {measured}", flush=True)
            for model in models:
                record = calibrate.attempt(partial(trial_cell, model, h, rate, {**cluster, "cpus": cpus})) \
                    if trial else None
                t0 = time.perf_counter()
                try:
                    planned, picked, scn, probed = _cell(model, h, rate, cpus, out, measured, record)
                except PlanError as e:  # (a world the model's batch and layers cannot be cut over)
                    print(f"{model}, {h} hosts, {rate}: {e}; the cell is skipped", flush=True)
                    continue
                plan_s = time.perf_counter() - t0
                scn.steps = steps
                scn.cluster = {**cluster, "cpus": cpus}
                cell_out = out / f"{model}-h{h}-{rate}"
                if record:  # every rank's raw measurements: a change of the fit is judged on them again
                    cell_out.mkdir(parents=True, exist_ok=True)
                    (cell_out / "trial.json").write_text(json.dumps(record, indent=1))
                records = run_scenario(scn, cell_out, repeats, prefix="tspl")
                for rank, e in enumerate(planned.ranked):
                    if e not in picked:
                        continue
                    label = short(e.plan).replace(" ", "-")
                    runs = [r for r in records if r["strategy"] == label]
                    rows.append(_row(model, h, rate, rank + 1, e, runs, cell_out, label, plan_s))
                    topo = planned.topology
                    rows[-1].update(latency=topo.latency, speed=topo.speed, rate_mbit=topo.rate_mbit,
                                    overlap=topo.overlap, per_micro=topo.per_micro, calibrated=record is not None,
                                    probe=measured,
                                    trial_s=max(r["seconds"] for r in record["ranks"]) if record else None,
                                    predicted_probe=estimate(e.plan, planned.profile.job.settings,
                                                             planned.profile, probed).step)
                save(rows)
    return rows


def _saved(out: Path) -> tuple[str, list[dict]]:
    from ..errors import ConfigError

    try:
        saved = json.loads((out / "results.json").read_text())
        return saved["command"], saved["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{out / 'results.json'} is not a planner check tessel wrote ({str(e)[:80]}); "
                          "run 'tessel bench plan' first") from None


def reprice(rows: list[dict], out: Path) -> list[dict]:
    """The saved candidates priced again by today's planner: each cell's plan files and probed topology, one
    fresh profile per model, the measurements kept. A change of the cost model is judged on the same runs
    (whose noise it cannot change); the profile is this machine's now, so it carries today's drift."""
    from ..cluster.emulate import parse_rate
    from ..plan import ParallelPlan

    profiles, again = {}, []
    for r in rows:
        cfg = load_config(None, [*MODELS[r["model"]], *COMMON])
        topo = Topology(ranks=r["hosts"], hosts=r["hosts"], link_mbit=parse_rate(r["rate"]) / 1e6,
                        latency=r["latency"], tiny_latency=(r.get("probe") or {}).get("tiny_latency", 0.0),
                        speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"],
                        per_micro=r.get("per_micro") if r.get("calibrated") else None,  # (a trial's, measured)
                        source="the saved probe or trial of the cell")
        topo = topology.beside_trial(topo, r.get("probe") or {})
        if r["model"] not in profiles:  # profiled at every candidate's micro-batch size, as planning does
            profiles[r["model"]] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
        label = r["plan"].replace(" ", "-")
        plan = ParallelPlan.from_json((out / "plans" / f"{r['model']}-h{r['hosts']}-{r['rate']}" /
                                       f"{label}.json").read_text())
        # the saved files predate plans that carry the table policy: the cell's config gives it
        e = estimate(plan.with_(sparse=policy_of(cfg)), settings_of(cfg), profiles[r["model"]], topo)
        again.append({**r, "predicted": e.step, "compute": e.compute, "comm": e.comm, "bubble": e.bubble,
                      "predicted_at_run": r.get("predicted_at_run", r["predicted"])})
    return again


def _row(model, hosts, rate, rank, e, runs, cell_out: Path, label: str, plan_s: float) -> dict:
    measured = statistics.median(r["step_time"] for r in runs) if runs else None
    counted = {}
    for d in sorted((cell_out / "runs").glob(f"{model}-{label}-h{hosts}-{rate}-r*")):
        f = d / "summary.json"
        if f.is_file():
            s = json.loads(f.read_text())
            counted = {c: v["sent_max_rank_total"] / max(s["steps_run"], 1) for c, v in s["bytes"].items()}
            break
    channels = sorted(set(EXACT) | {c for c in (*e.bytes, *counted) if c.startswith("tp.")})
    return {"model": model, "hosts": hosts, "rate": rate, "rank": rank, "plan": short(e.plan),
            "predicted": e.step, "compute": e.compute, "comm": e.comm, "bubble": e.bubble,
            "measured": measured, "runs": [r["step_time"] for r in runs], "planning_s": plan_s,
            "rounds": {r["repeat"]: r["step_time"] for r in runs},
            "bytes_predicted": {c: e.bytes.get(c, 0) for c in channels},
            "bytes_measured": {c: counted.get(c, 0) for c in channels} if counted else None}


def _rounds(row: dict) -> dict[int, float]:
    """round -> step time; rows saved before rounds were recorded list their runs in round order."""
    return {int(k): v for k, v in row["rounds"].items()} if "rounds" in row else dict(enumerate(row["runs"]))


def judge_pick(pick: dict[int, float], best: dict[int, float], slack: float = SLACK) -> tuple[Ratio | None, str]:
    """The pick's step time over the best measured candidate's, paired by round, and the verdict on "within
    ``slack``": 'within' where the interval lies at or under it, 'miss' where it lies above, 'not distinguishable'
    where it straddles it. With one round the point decides and the verdict says so.

    >>> judge_pick({0: 1.104, 1: 1.105, 2: 1.103}, {0: 1.0, 1: 1.0, 2: 1.0})[1]
    'miss'
    >>> judge_pick({0: 1.02, 1: 1.20, 2: 1.10}, {0: 1.0, 1: 1.0, 2: 1.0})[1]
    'not distinguishable'
    """
    ratio = paired_ratio(pick, best)
    if ratio is None:
        return None, "pick failed to run"
    if ratio.n < 2:
        return ratio, ("within" if ratio.value <= slack else "miss") + " (1 round)"
    if ratio.high <= slack:
        return ratio, "within"
    return ratio, "miss" if ratio.low > slack else "not distinguishable"


def _spearman(xs: list[float], ys: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic) if len(xs) > 2 else float("nan")


def _previous(out: Path) -> tuple[str, list[dict]] | None:
    try:
        saved = json.loads((out / PREVIOUS).read_text())
        return saved["command"], saved["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cells(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """(name, the cell's rows by rank) per (model, hosts, rate), 4 hosts before 8 and 1 Gbit/s before 200 Mbit/s."""
    keys = sorted({(r["model"], r["hosts"], r["rate"]) for r in rows}, key=lambda c: (c[1], c[2], c[0]))
    return [(f"{m}, {h} hosts, {rate}", sorted((r for r in rows if (r["model"], r["hosts"], r["rate"]) == (m, h, rate)),
                                               key=lambda r: r["rank"])) for m, h, rate in keys]


def _pick(rs: list[dict]) -> tuple[Ratio | None, str]:
    ok = [r for r in rs if r["measured"]]
    pick = min(rs, key=lambda r: r["predicted"])  # rank 1 at the run; re-priced, today's first of these
    if not pick["measured"]:
        return None, "pick failed"
    return judge_pick(_rounds(pick), _rounds(min(ok, key=lambda r: r["measured"])))


def floor(rs: list[dict]) -> tuple[float, float, float] | None:
    """What a perfect predictor scores on a cell: each candidate's median over its even rounds taken as the
    prediction of its median over its odd rounds, judged as the planner is (median and worst absolute error,
    Spearman). The two halves interleave, so the machine's drift over the invocation falls in both; a goal this
    misses cannot be told from noise at half the cell's rounds. None where some candidate has fewer than 2 rounds of
    either parity.

    >>> rows = [{"measured": 1.1, "rounds": {0: 1.0, 1: 1.2, 2: 1.0, 3: 1.2}},   # even 1.0 against odd 1.2: 1/6
    ...         {"measured": 2.0, "rounds": {0: 2.0, 1: 2.0, 2: 2.0, 3: 2.0}},   # 0
    ...         {"measured": 3.1, "rounds": {0: 3.3, 1: 3.0, 2: 3.3, 3: 3.0}}]   # 0.3 over 3.0: 0.1
    >>> [round(v, 3) for v in floor(rows)]
    [0.1, 0.167, 1.0]
    """
    parts = [[[t for k, t in _rounds(r).items() if k % 2 == h] for h in (0, 1)] for r in rs if r["measured"]]
    if not parts or min(len(half) for p in parts for half in p) < 2:
        return None
    halves = [[statistics.median(p[h]) for p in parts] for h in (0, 1)]
    errs = [abs(p - m) / m for p, m in zip(*halves)]
    return statistics.median(errs), max(errs), _spearman(*halves)


def headline(rows: list[dict], who: str = "Over all cells") -> str:
    """Median and worst absolute error over every candidate, and the picks counted by verdict."""
    errors = [abs(r["predicted"] - r["measured"]) / r["measured"] for r in rows if r["measured"]]
    if not errors:
        return f"{who}: no candidate ran."
    judged = [_pick(rs)[1].split(" (")[0] for _, rs in _cells(rows)]
    counts = ", ".join(f"{judged.count(v)} {v}" for v in ("within", "miss", "not distinguishable", "pick failed")
                       if judged.count(v))
    return (f"{who}: median absolute error {statistics.median(errors):.0%}, worst {max(errors):.0%}, {len(errors)} "
            f"candidates. The pick within {SLACK - 1:.0%} of the best measured (paired by round; a miss only where the "
            f"interval lies above {SLACK:.2f}x): {counts}, of {len(judged)} cells.")


def _detail(name: str, r: dict) -> str:
    runs = ", ".join(f"{t * 1e3:.0f}" for t in r["runs"])
    err = f"{(r['predicted'] - r['measured']) / r['measured']:+.0%}" if r["measured"] else "failed"
    same = ("exact" if r["bytes_measured"] and r["bytes_predicted"] == {k: round(v) for k, v in
                                                                         r["bytes_measured"].items()}
            else f"predicted {r['bytes_predicted']}, counted {r['bytes_measured']}")
    return (f"| {name} | {r['rank']} | {r['plan']} | {r['predicted'] * 1e3:.0f} ({r['compute'] * 1e3:.0f}"
            f" / {r['comm'] * 1e3:.0f} / {r['bubble'] * 1e3:.0f}) | "
            f"{(r['measured'] or 0) * 1e3:.0f} ({runs}) | {err} | {same} |")


def markdown(rows: list[dict], command: str, previous: tuple[str, list[dict]] | None = None) -> str:
    # (runs before 2026-11-26 counted dp.dense, pp and tp only; later ones every tp.* channel too, and from
    # 2026-12-07 FSDP's three)
    keys = {k for r in rows for k in (*(r.get("bytes_predicted") or {}), *(r.get("bytes_measured") or {}))}
    named = ["dp.dense", "pp", "tp", *(["every tp.* channel"] if any(k.startswith("tp.") for k in keys) else []),
             *(["FSDP's dp.gather, dp.scatter and dp.replicate"] if "dp.gather" in keys else [])]
    channels = ", ".join(named[:-1]) + " and " + named[-1]
    lines = ["Predicted against measured step time of the planner's top 3 and 5 other candidates per cell "
             f"(`{command}`). Error: (predicted − measured) / measured. Bytes: the predicted {channels} bytes of "
             "the busiest rank against tessel.comm's count.", ""]
    if any("predicted_at_run" in r for r in rows):
        lines += ["Re-priced: the predictions are today's planner's on the run's plans and probed topology (one fresh "
                  "profile per model), against the run's measurements; rank is the candidate's rank at the run, "
                  "and the pick is the candidate today's planner prices fastest among those run.", ""]
    lines += [headline(rows), ""]
    if any(r.get("calibrated") for r in rows):
        plain = [{**r, "predicted": r["predicted_probe"]} for r in rows]
        lines += [headline(plain, "The same runs priced without the trial (the probe's rates, as before)"), ""]
        trials = [r["trial_s"] for r in rows if r.get("trial_s")]
        lines += [f"The calibration trial took {min(trials):.1f}–{max(trials):.1f} s per cell and model.", ""]
    if previous is not None:
        lines += [headline(previous[1], f"The previous run (`{previous[0]}`)"), ""]
    summary = ["| cell | candidates run | median abs error | worst abs error | Spearman | pick over best measured | "
               "bytes exact | planning s |", "|---|---|---|---|---|---|---|---|"]
    detail = ["| cell | rank | plan | predicted ms (compute / comm / bubble) | measured ms (runs) | error | bytes |",
              "|---|---|---|---|---|---|---|"]
    floors: list[str] = []
    for name, rs in _cells(rows):
        ok = [r for r in rs if r["measured"]]
        errs = [abs(r["predicted"] - r["measured"]) / r["measured"] for r in ok]
        rho = _spearman([r["predicted"] for r in ok], [r["measured"] for r in ok])
        ratio, verdict = _pick(rs)
        vs = f"{ratio.text()}: {verdict}" if ratio else verdict
        exact = [r["bytes_predicted"] == {k: round(v) for k, v in (r["bytes_measured"] or {}).items()} for r in ok]
        med, worst = (f"{statistics.median(errs):.0%}", f"{max(errs):.0%}") if errs else ("–", "–")
        summary.append(f"| {name} | {len(ok)} of {len(rs)} | {med} | {worst} | {rho:.2f} | {vs} | "
                       f"{sum(exact)} of {len(exact)} | {rs[0]['planning_s']:.1f} |")
        detail += [_detail(name, r) for r in rs]
        if (f := floor(rs)) is not None:
            floors.append(f"| {name} | {f[0]:.0%} | {f[1]:.0%} | {f[2]:.2f} |")
    if floors:
        summary += ["", "The measurement's own floor: each candidate's median over its even rounds taken as a perfect "
                    "prediction of its median over its odd rounds (a goal this misses cannot be told from noise at "
                    "half the rounds).", "", "| cell | median abs error | worst abs error | Spearman |",
                    "|---|---|---|---|", *floors]
    return "\n".join(lines + summary + ["", *detail]) + "\n"


def scatter(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    for model in sorted({r["model"] for r in rows}):
        pts = [(r["measured"] * 1e3, r["predicted"] * 1e3) for r in rows if r["model"] == model and r["measured"]]
        if pts:
            ax.scatter(*zip(*pts), label=model, s=18)
    lim = max((max(r["measured"], r["predicted"]) * 1e3 for r in rows if r["measured"]), default=1) * 1.1
    ax.plot([1, lim], [1, lim], color="grey", linewidth=0.8, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured median step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(ns, argv: list[str]) -> int:
    import shlex

    from ..errors import ConfigError

    models = [m.strip() for m in (ns.models or ",".join(MODELS)).split(",")]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise ConfigError(f"--models {','.join(bad)} not in the plan check; valid: {', '.join(MODELS)}")
    hosts = sorted({int(h) for h in (ns.hosts or "4,8").split(",")})
    rates = [r.strip() for r in (ns.rates or "1gbit,200mbit").split(",")]
    out = Path(ns.out or "bench/plan")
    if ns.report_only:
        command, rows = _saved(out)
        if ns.reprice:
            rows = reprice(rows, out)
            command += f"`, re-priced by `tessel {' '.join(shlex.quote(a) for a in argv)}"
    else:
        if ns.repeats < 3:
            raise ConfigError(f"--repeats {ns.repeats}: the plan check judges the pick by an interval over rounds; "
                              "valid: 3 or more")
        out.mkdir(parents=True, exist_ok=True)
        if (out / "results.json").is_file():  # kept beside the new run, and its headline printed under the new one
            (out / "results.json").replace(out / PREVIOUS)
        command = "tessel " + " ".join(shlex.quote(a) for a in argv)
        cluster = {"period_us": round(ns.cpu_period * 1000), "burst_us": round(ns.cpu_burst * 1000), "pin": ns.pin}
        if ns.cpus:
            cluster["cpus"] = ns.cpus
        def save(rows: list[dict]) -> None:
            (out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))

        save(run(models, hosts, rates, out, ns.repeats, ns.steps or 10, cluster, trial=ns.trial, save=save))
        rows = _saved(out)[1]
    text = markdown(rows, command, _previous(out))
    plot = scatter(rows, out / "plan_scatter.png")
    (out / "report.md").write_text(text)
    if ns.doc:
        import os

        doc = Path(ns.doc)
        update_doc(doc, "plan", text + f"\n![predicted against measured]({os.path.relpath(plot, doc.parent)})\n")
    print(text)
    return 0
