"""Turn benchmark runs into a table with the physical bound, JSON, plots, and a section of docs/benchmarks.md.

For every (model, strategy, hosts, rate):

- measured step time: median over repeats of each run's median step time (min–max across repeats, and
  the spread (max − min) / median);
- compute-only time: the same job on the same hosts with unshaped links, in the same round;
- communication bound: bytes the busiest rank sends per step ÷ link rate (a host's link carries them);
- balanced link = busiest rank's bytes per step ÷ compute-only time: the rate at which communication takes
  as long as computation; cells at and below it are where overlap can show;
- efficiency = max(compute-only, bound) ÷ measured, per round, as a geometric mean with its 95% interval:
  1.0 is the best the hardware allows, since compute and communication can at most overlap completely, so
  a value above 1 is noise, and its interval then includes 1;
- ratios against the baseline: paired by round, with their 95% interval (``stats``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from ..cluster.emulate import PERIOD_US, parse_rate
from ..sparse.schedule import WAITS
from ..train.metrics import human_bytes
from .cells import versus
from .compose_tables import compose_table
from .machine import cpu
from .scenarios import Scenario
from .stats import Ratio, interval, jitter_spread, paired_ratio, spread
from .tensor_tables import tensor_plot, tensor_table

UNSHAPED = "unshaped"


def environment(scn: Scenario, repeats: int) -> dict[str, Any]:
    return {
        "torch": torch.__version__, "python": platform.python_version(), "kernel": platform.release(), "cpu": cpu(),
        "cores": os.cpu_count(), "hosts": scn.hosts, "rates": scn.rates, "steps_per_run": scn.steps,
        "repeats": repeats, "cpus_per_host": "cores / hosts", "threads_per_worker": 1,
        "cluster": {"period_us": PERIOD_US, "burst_us": 0, "pin": False, **scn.cluster},
    }


def _cpu_model(env: dict) -> str:
    """' (MODEL, bf16 arithmetic: yes/no)' where the run recorded its CPU (older runs did not)."""
    c = env.get("cpu")
    if not c:
        return ""
    bf16 = {True: "yes", False: "no"}.get(c.get("bf16"), "unknown")
    return f" ({c.get('model') or 'CPU model unknown'}, bf16 arithmetic: {bf16})"


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "spread": spread(values)}


def _by_round(rs: list[dict] | None) -> dict[int, float]:
    return {r["repeat"]: r["step_time"] for r in rs or []}


def _efficiency(compute: dict[int, float], bound: float, measured: dict[int, float]) -> Ratio | None:
    """max(compute-only, bound) / measured, paired by round; None without a compute-only run to pair."""
    rounds = sorted(set(compute) & set(measured))
    return interval([max(compute[r], bound) / measured[r] for r in rounds]) if rounds else None


def _dict(r: Ratio | None) -> dict | None:
    return r.to_dict() if r else None


def ratio_text(d: dict | None, unit: str = "x") -> str:
    """A row's ratio with its interval, e.g. '1.23x (1.10–1.38)'; '–' where there is none."""
    return Ratio(**d).text(unit) if d else "–"


def _median_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(records: list[dict[str, Any]], scn: Scenario) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if not r.get("did_not_fit"):  # a run its hosts' memory limit ended has no step to count
            groups[(r["model"], r["strategy"], r["hosts"], r["rate"])].append(r)

    def med(key, field):
        rs = groups.get(key)
        return statistics.median(r[field] for r in rs) if rs else None

    def rounds(key):
        return _by_round(groups.get(key))

    rows = []
    for (model, strategy, hosts, rate), rs in sorted(groups.items()):
        if rate == UNSHAPED and hosts > 1:
            continue  # compute-only runs feed the bound; they are not rows of their own
        step = _stats([r["step_time"] for r in rs])
        # torch's own collectives are not counted; where a counted strategy moves the same bytes, use its count,
        # else what the busiest host's interface sent (headers included), where the runs recorded it
        wire = _median_or_none([r.get("wire_max_host_per_step") for r in rs])
        counted_as = scn.same_bytes.get(strategy, strategy)  # whose count stands for its bytes (None: nobody's)
        sent = (med((model, counted_as, hosts, rate), "max_rank_sent_per_step") or 0.0) if counted_as else (wire or 0.0)
        on_wire = counted_as is None and bool(wire)
        compute = med((model, strategy, hosts, UNSHAPED), "step_time")
        bound = sent * 8 / parse_rate(rate) if rate != UNSHAPED else 0.0
        mine = _by_round(rs)
        efficiency = _efficiency(rounds((model, strategy, hosts, UNSHAPED)), bound, mine) if sent else None
        vs = paired_ratio(rounds((model, scn.baseline, hosts, rate)), mine)
        one_host = med((model, strategy, 1, UNSHAPED), "throughput")
        row = {
            "model": model, "strategy": strategy, "hosts": hosts, "rate": rate, "step_time": step, "rounds": mine,
            "jitter_spread": jitter_spread([r.get("step_times") for r in rs]),
            "throughput": _stats([r["throughput"] for r in rs]), "unit": rs[0]["unit"],
            "compute_only": compute, "comm_bound": bound, "sent_per_step_max_rank": sent, "sent_on_wire": on_wire,
            "wire_per_step_max_host": wire,
            # the link rate at which the busiest rank's bytes take as long as the compute-only step: at and
            # below it communication is at least half the step, so overlap has something to hide
            "balanced_rate": sent * 8 / compute if compute and sent else None,
            "efficiency": efficiency.value if efficiency else None, "efficiency_ci": _dict(efficiency),
            "vs_baseline": vs.value if vs else None, "vs_baseline_ci": _dict(vs),
            "scaling_vs_1_host": (statistics.median(r["throughput"] for r in rs) / one_host) if one_host else None,
            "bytes_per_step": rs[0]["bytes_per_step"], "peak_mem": max(r["peak_mem"] for r in rs),
            "table_mem": max(r.get("table_mem", 0) for r in rs),
            "final_loss": statistics.median(r["final_loss"] for r in rs),
            "sparse_hidden": _median_or_none([r.get("sparse_hidden") for r in rs]),
            "sparse_comm": _median_or_none([r.get("sparse_comm") for r in rs]),
            "sparse_waits": _median_waits([r.get("sparse_waits") for r in rs]),
            "sparse_work": _median_or_none([r.get("sparse_work") for r in rs]),
            "plan": rs[0].get("sparse_plan") or {},
            "pipeline": _pipeline_stats([r.get("pipeline") for r in rs]),
            "act_mem": _median_or_none([r.get("act_mem") for r in rs]),
            "tensor": rs[0].get("tensor"), "tensor_formula": rs[0].get("tensor_formula"),
            "state_mem": max(r.get("state_mem", 0) for r in rs),
        }
        rows.append(row)
    return rows


def _host_cpus(env: dict[str, Any]) -> str:
    c = env.get("cluster") or {}
    if c.get("cpus"):
        return f"{c['cpus']:g}"
    return "(cores - hosts x NIC) / hosts" if c.get("nic_cpus") else env["cpus_per_host"]


def _cpu_settings(env: dict[str, Any]) -> str:
    c = env.get("cluster") or {}
    if not c:
        return ""
    text = f" as a quota per {c['period_us'] / 1000:g} ms CFS period"
    return text + (f", burst {c['burst_us'] / 1000:g} ms" if c["burst_us"] else "") + (
        ", host i pinned to core i mod cores" if c["pin"] else "") + (
        f", gloo's threads on a NIC group of {c['nic_cpus']:g} CPU per host" if c.get("nic_cpus") else "")


def runs_per_cell(rows: list[dict[str, Any]]) -> str:
    """What a header says of the repeats: the real count of runs per cell, not the count asked for.

    >>> runs_per_cell([{"step_time": {"n": 3}}, {"step_time": {"n": 1}}])
    '1–3 runs per cell (the runs column gives each), in rounds of alternating order'
    """
    counts = sorted({r["step_time"]["n"] for r in rows}) or [0]
    if counts == [1]:
        return "one run per cell, so no intervals"
    many = f"{counts[0]} runs" if len(counts) == 1 else f"{counts[0]}–{counts[-1]} runs"
    return many + " per cell" + (" (the runs column gives each)" if len(counts) > 1 else "") + \
        ", in rounds of alternating order"


def _counted(scn: Scenario) -> str:
    """The strategy the bytes and scaling plots show: the first whose traffic tessel counts."""
    return next((s for s in scn.strategies if s not in scn.same_bytes and not s.startswith("torch")), scn.baseline)


def markdown(rows: list[dict[str, Any]], scn: Scenario, env: dict[str, Any], commands: list[str]) -> str:
    head = (f"Scenario `{scn.name}`: {scn.about}. Baseline for ratios: `{scn.baseline}`.\n\n"
            "Reproduce (as root, on an idle machine): " + "; then ".join(f"`{c}`" for c in commands) + "\n\n"
            f"Environment: torch {env['torch']}, Python {env['python']}, {env['cores']} cores{_cpu_model(env)} "
            f"shared by the emulated hosts (each host {_host_cpus(env)} CPU"
            f"{_cpu_settings(env)}, "
            f"{env['threads_per_worker']} thread per worker), "
            f"{env['steps_per_run']} steps per run (median over steps after 3 warm-up steps), "
            f"{runs_per_cell(rows)}. Ratios and efficiency: geometric mean over rounds with the 95% interval in "
            "brackets; a difference whose interval includes 1 is noise.\n\n")
    cols = ["model", "strategy", "hosts", "link", "runs", "step ms: median (min–max)", "spread",
            "spread from step jitter", "throughput/s",
            "vs baseline", "compute-only ms", "comm bound ms", "bound by", "balanced link", "efficiency",
            "sent/step busiest rank", "peak mem/rank"]
    wired = any(r.get("wire_per_step_max_host") for r in rows)
    if wired:
        cols.insert(cols.index("peak mem/rank"), "wire/step busiest host")
        head += ("Wire: what the busiest host's interface sent per step, as its kernel counts (headers included; "
                 "tessel/netif.py); \"(wire)\": a strategy tessel does not count, whose bound rests on it.\n\n")
    if any(r["table_mem"] for r in rows):
        cols.append("table+opt mem/rank")
    hidden = any(r.get("sparse_hidden") is not None for r in rows)
    if hidden:
        cols.append("sparse comm ms (hidden)")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        s = r["step_time"]
        lines.append("| " + " | ".join([
            r["model"], r["strategy"], str(r["hosts"]), r["rate"], str(s["n"]),
            f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.1f}–{s['max'] * 1e3:.1f})", f"{s['spread']:.0%}",
            f"{r['jitter_spread']:.0%}" if r.get("jitter_spread") is not None else "–",
            f"{r['throughput']['median']:.0f} {r['unit']}",
            ratio_text(r.get("vs_baseline_ci")),
            f"{r['compute_only'] * 1e3:.1f}" if r["compute_only"] else "–",
            f"{r['comm_bound'] * 1e3:.1f}" if r["comm_bound"] else "–",
            ("comm" if r["comm_bound"] > r["compute_only"] else "compute") if r["compute_only"] else "–",
            f"{r['balanced_rate'] / 1e6:.0f} Mbit/s" if r.get("balanced_rate") else "–",
            ratio_text(r.get("efficiency_ci"), ""),
            (human_bytes(r["sent_per_step_max_rank"]) + (" (wire)" if r.get("sent_on_wire") else ""))
            if r["sent_per_step_max_rank"] else "–",
            *([human_bytes(r["wire_per_step_max_host"]) if r.get("wire_per_step_max_host") else "–"] if wired else []),
            human_bytes(r["peak_mem"]),
            *([human_bytes(r["table_mem"])] if "table+opt mem/rank" in cols else []),
            *([f"{r['sparse_comm'] * 1e3:.1f} ({r['sparse_hidden']:.0%})" if r.get("sparse_hidden") is not None
               else "–"] if hidden else []),
        ]) + " |")
    return (head + "\n".join(lines) + "\n" + auto_table(rows) + tables_time_table(rows) + pipeline_table(rows)
            + tensor_table(rows, projection=scn.name == "tensor") + compose_table(rows, scn))


def _median_waits(runs: list[dict | None]) -> dict[str, float] | None:
    """Each kind of wait's median over the runs that recorded waits (a run without a kind waited 0 for it).

    >>> _median_waits([{"ids": 0.1, "rows": 0.3}, {"ids": 0.2}, {"ids": 0.4, "grads": 0.1}])
    {'grads': 0.0, 'ids': 0.2, 'rows': 0.0}
    """
    runs = [w for w in runs if w is not None]
    if not runs:
        return None
    return {k: statistics.median(w.get(k, 0.0) for w in runs) for k in sorted({k for w in runs for k in w})}


def tables_time_table(rows: list[dict]) -> str:
    """Where the alltoall tables' part of a step went (rank 0, medians over runs): the trainer's waits by what it
    waited for, and the tables' own work outside them."""
    # only strategies whose tables ran collectives on the clock (alltoall); ps and the rest record an empty one
    mine = [r for r in rows if r.get("sparse_waits") is not None and r.get("sparse_comm") and r["rate"] != UNSHAPED]
    if not mine:
        return ""
    out = ["", "Where the tables' part of a step goes (rank 0, ms per step, median over runs): the trainer's waits "
           "for the route (ids to their owners), for rows (sent when asked, or, scheduled, before the owner's "
           "update), for late rows (those only the update makes final), for the row gradients' exchange; and the "
           "tables' own work outside those waits (index, copy, deduplicate, the row update).", "",
           "| model | strategy | hosts | link | step ms | tables' traffic in flight | waits: ids | rows | late rows "
           "| grads | all waits | own work |", "|" + "---|" * 12]
    for r in mine:
        w = r["sparse_waits"]
        cells = [f"{w.get(k, 0.0) * 1e3:.1f}" for k in WAITS]
        out.append("| " + " | ".join([
            r["model"], r["strategy"], str(r["hosts"]), r["rate"], f"{r['step_time']['median'] * 1e3:.1f}",
            f"{r['sparse_comm'] * 1e3:.1f}" if r.get("sparse_comm") is not None else "–", *cells,
            f"{sum(w.values()) * 1e3:.1f}",
            f"{r['sparse_work'] * 1e3:.1f}" if r.get("sparse_work") is not None else "–"]) + " |")
    return "\n".join(out) + "\n"


def _pipeline_stats(runs: list[dict | None]) -> dict[str, Any] | None:
    runs = [p for p in runs if p]
    if not runs:
        return None
    return {"regime": regime(runs[0]), "bubble": _median_or_none([p.get("bubble") for p in runs]),
            "stage_bubbles": per_stage(runs, "bubble_per_rank"),
            "wait_activation": per_stage(runs, "wait_activation_per_rank"),
            "wait_grad": per_stage(runs, "wait_grad_per_rank"),
            "plan_imbalance": _median_or_none([p.get("plan_imbalance") for p in runs]),
            "busy_imbalance": _median_or_none([p.get("busy_imbalance") for p in runs]),
            "kept": max(max(p.get("kept_bytes_per_rank") or [0]) for p in runs),
            "bounds": [tuple(tuple(b) for b in p.get("plan_bounds") or []) for p in runs]}


def per_stage(runs: list[dict], key: str) -> list[float] | None:
    """Each stage's ``key`` (a per-rank list in the pipeline summary), the median over runs, in stage order;
    None where a run could not measure it (torch's schedules).

    >>> per_stage([{"stage_of_rank": [1, 0], "bubble_per_rank": [0.3, 0.1]},
    ...            {"stage_of_rank": [0, 1], "bubble_per_rank": [0.2, 0.5]}], "bubble_per_rank")
    [0.15000000000000002, 0.4]
    """
    values: dict[int, list[float]] = {}
    for p in runs:
        for stage, v in zip(p.get("stage_of_rank") or [], p.get(key) or []):
            if v is None:
                return None
            values.setdefault(stage, []).append(v)
    return [statistics.median(values[k]) for k in sorted(values)] or None


def regime(p: dict[str, Any]) -> str:
    """A pipelined run's staleness regime: flushed, or the most updates a first-stage forward runs ahead of
    its own (``ahead``; SpecTrain's thesis runs 1 micro-batch per step, where that is stages − 1).

    >>> regime({"schedule": "async-predict", "micro_batches": 4, "plan_bounds": [[0, 2]] * 4})
    'async, s ≤ 1 (4 stages, 4 micro-batches)'
    >>> regime({"schedule": "torch-1f1b", "micro_batches": 4, "plan_bounds": [[0, 2]] * 4})
    'flushed'
    """
    from ..choices import Schedule, names, schedule
    from ..pipeline.schedules import ahead

    stages, micro = len(p.get("plan_bounds") or []), p.get("micro_batches") or 1
    if not stages or p.get("schedule") not in names(Schedule) or schedule(p["schedule"]).flushed:
        return "flushed"
    most = max(ahead(i, micro, 0, stages) for i in range((stages + 1) * micro))
    return f"async, s ≤ {most} ({stages} stages, {micro} micro-batch{'es' if micro > 1 else ''})"


def pipeline_table(rows: list[dict[str, Any]]) -> str:
    """Pipeline runs: speed against DDP on the same hosts, measured bubble and stage balance, memory kept."""
    pipes = [r for r in rows if r.get("pipeline")]
    if not pipes:
        return ""
    lines = ["", "Pipeline runs: DDP's step time over the strategy's in the same cell, paired by round (95% interval); "
             "bubble = share of a stage's step time "
             "not spent computing (median over runs; mean over stages, then each stage from first to last; "
             "torch's schedules run their work where it cannot be timed); stage balance = slowest stage over the "
             "mean, as the profile promised and as measured (busy time); weight copies = stashed or predicted "
             "weights kept (largest rank); regime = "
             "flushed, or asynchronous with s = the most updates the first stage applies between a micro-batch's "
             "forward and its own update (SpecTrain's thesis: 1 micro-batch per step, s = stages − 1).", "",
             "| model | link | strategy | regime | vs ddp | bubble | balance: profile / measured | weight copies "
             "| stage bounds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in pipes:
        p = r["pipeline"]
        vs = versus(rows, r, "ddp")
        fmt = (lambda v, f: f.format(v) if v is not None else "–")
        bounds = sorted(set(p["bounds"]))
        lines.append(f"| {r['model']} | {r['rate']} | {r['strategy']} | {p['regime']} | {vs} | "
                     f"{fmt(p['bubble'], '{:.0%}')}{_per_stage(p.get('stage_bubbles'))} | "
                     f"{fmt(p['plan_imbalance'], '{:.2f}')} / {fmt(p['busy_imbalance'], '{:.2f}')} | "
                     f"{human_bytes(p['kept']) if p['kept'] else '–'} | "
                     f"{'; '.join(' '.join(f'{lo}-{hi - 1}' for lo, hi in b) for b in bounds)} |")
    return "\n".join(lines) + "\n" + wait_table(pipes)


def wait_table(pipes: list[dict[str, Any]]) -> str:
    """Where tessel's stages idle: per stage, the bubble and the time blocked on each neighbour's messages."""
    timed = [r for r in pipes if r["pipeline"].get("wait_activation")]
    if not timed:
        return ""
    lines = ["", "Where tessel's stages wait (median over runs, ms per step): blocked on the previous stage's "
             "activation, and on the next stage's gradient; the rest of the bubble is the step tail's norm "
             "exchange (flushed schedules) and the loop between steps.", "",
             "| model | link | strategy | stage | bubble | waits on previous | waits on next |",
             "|---|---|---|---|---|---|---|"]
    for r in timed:
        p = r["pipeline"]
        for k, (act, grad) in enumerate(zip(p["wait_activation"], p["wait_grad"])):
            bubble = f"{p['stage_bubbles'][k]:.0%}" if p.get("stage_bubbles") else "–"
            lines.append(f"| {r['model']} | {r['rate']} | {r['strategy']} | {k} | {bubble} | {act * 1e3:.1f} | "
                         f"{grad * 1e3:.1f} |")
    return "\n".join(lines) + "\n"


def _per_stage(bubbles: list[float] | None) -> str:
    return f" ({' / '.join(f'{b:.0%}' for b in bubbles)})" if bubbles and len(bubbles) > 1 else ""


def auto_table(rows: list[dict[str, Any]]) -> str:
    """Where a scenario has an ``auto`` strategy: what it chose and how it compares with the fastest run."""
    autos = [r for r in rows if r["strategy"] == "auto" and r["rate"] != UNSHAPED]
    if not autos:
        return ""
    lines = ["", "What `auto` chose, against the fastest strategy measured in the same cell:", "",
             "| model | hosts | link | auto chose | auto ms | fastest | fastest ms | auto / fastest |",
             "|---|---|---|---|---|---|---|---|"]
    for a in autos:
        same = [r for r in rows if (r["model"], r["hosts"], r["rate"]) == (a["model"], a["hosts"], a["rate"])]
        best = min(same, key=lambda r: r["step_time"]["median"])
        plan = ", ".join(f"{k}={v}" for k, v in a["plan"].items()) or "no tables"
        lines.append(f"| {a['model']} | {a['hosts']} | {a['rate']} | {plan} | {a['step_time']['median'] * 1e3:.1f} | "
                     f"{best['strategy']} | {best['step_time']['median'] * 1e3:.1f} | "
                     f"{a['step_time']['median'] / best['step_time']['median']:.2f} |")
    return "\n".join(lines) + "\n"


def plots(rows: list[dict[str, Any]], scn: Scenario, out: Path) -> list[Path]:
    """Throughput per strategy, bytes per channel, and scaling over hosts and rate, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    top = max(scn.hosts)
    fig, axes = plt.subplots(1, len(scn.models), figsize=(4.2 * len(scn.models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], scn.models):
        sel = [r for r in rows if r["model"] == model and r["hosts"] == top]
        rates = sorted({r["rate"] for r in sel}, key=lambda x: -parse_rate(x) if x != UNSHAPED else 0)
        width = 0.8 / max(len(scn.strategies), 1)
        for k, strategy in enumerate(scn.strategies):
            vals = [next((r["throughput"]["median"] for r in sel if r["rate"] == rt and r["strategy"] == strategy), 0)
                    for rt in rates]
            ax.bar([i + k * width for i in range(len(rates))], vals, width, label=strategy)
        ax.set_xticks([i + width * (len(scn.strategies) - 1) / 2 for i in range(len(rates))], rates)
        ax.set(title=f"{model}, {top} hosts", ylabel=f"{sel[0]['unit'] if sel else ''}/s")
        if sel:
            ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(_save(fig, out / "throughput.png"))

    counted = _counted(scn)
    shown = [st for st in scn.strategies if not st.startswith("torch")]  # torch's own traffic is not counted
    first_rate = scn.rates[0]
    sel = [r for r in rows if r["strategy"] in shown and (r["rate"] == first_rate or r["hosts"] == 1)]
    labels = sorted({(r["model"], r["hosts"], r["strategy"]) for r in sel},
                    key=lambda k: (k[0], k[1], shown.index(k[2])))
    channels = sorted({c for r in sel for c in r["bytes_per_step"]})
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(labels)), 4.2))
    bottom = [0.0] * len(labels)
    for c in channels:
        vals = [next(r["bytes_per_step"].get(c, 0) for r in sel if (r["model"], r["hosts"], r["strategy"]) == lab)
                / 2**20 for lab in labels]
        ax.bar(range(len(labels)), vals, bottom=bottom, label=c)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(labels)), [f"{m}\n{h}h {st}" for m, h, st in labels], fontsize=6, rotation=90)
    totals = [b for b in bottom if b > 0]
    if totals and max(totals) > 30 * min(totals):
        ax.set_yscale("log")  # dense and sparse strategies differ by orders of magnitude
    ax.set(ylabel="MiB sent per step per rank", title="bytes per channel")
    ax.legend(fontsize=7)
    fig.tight_layout()
    made.append(_save(fig, out / "bytes.png"))

    fig, axes = plt.subplots(1, len(scn.models), figsize=(4.2 * len(scn.models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], scn.models):
        for strategy in scn.strategies:
            for rate in scn.rates:
                pts = sorted((r["hosts"], r["throughput"]["median"]) for r in rows if r["model"] == model
                             and r["strategy"] == strategy and (r["rate"] == rate or r["hosts"] == 1))
                if len(pts) > 1:
                    ax.plot(*zip(*pts), marker="o", label=f"{strategy} {rate}")
        mine = [r for r in rows if r["model"] == model and r["strategy"] == counted]
        # Same work per step, so compute-only throughput is the measured one scaled by the step-time ratio.
        pts = sorted((r["hosts"], r["throughput"]["median"] * r["step_time"]["median"] / r["compute_only"])
                     for r in mine if r["compute_only"] and (r["rate"] == scn.rates[0] or r["hosts"] == 1))
        if len(pts) > 1:
            ax.plot(*zip(*pts), marker="o", linestyle="--", label=f"{counted} compute only")
        ax.set(title=model, xlabel="hosts", ylabel=f"{mine[0]['unit'] if mine else ''}/s")
        ax.set_xticks(scn.hosts)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(_save(fig, out / "scaling.png"))
    fig = tensor_plot(rows)
    if fig is not None:
        made.append(_save(fig, out / "tensor.png"))
    return made


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(records, scn: Scenario, out: Path, repeats: int, commands: list[str], doc: Path | None = None,
          env: dict[str, Any] | None = None) -> str:
    """results.json, report.md and plots under ``out``; optionally replace this scenario's section of ``doc``.

    ``env``: the machine the runs were taken on, when re-rendering saved runs (else this machine, now)."""
    env = env or environment(scn, repeats)
    rows = aggregate(records, scn)
    (out / "results.json").write_text(json.dumps({"environment": env, "commands": commands, "rows": rows,
                                                  "runs": records}, indent=1))
    text = markdown(rows, scn, env, commands)
    made = plots(rows, scn, out)
    (out / "report.md").write_text(text)
    if doc is not None:
        rel = [os.path.relpath(p, doc.parent) for p in made]
        section = text + "\n" + "\n".join(f"![{Path(p).stem}]({p})" for p in rel) + "\n"
        update_doc(doc, scn.name, section)
    return text


def update_doc(doc: Path, name: str, section: str) -> None:
    """Replace the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (appended if absent)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    old = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{start}\n{section}{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _: block, old) if pattern.search(old) else old.rstrip() + "\n\n" + block + "\n"
    doc.write_text(new)
