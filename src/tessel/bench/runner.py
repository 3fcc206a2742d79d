"""Run a scenario on emulated hosts: every strategy side by side, in rounds of alternating order.

For each host count the runner brings up the hosts once. A round runs every (link rate, model, strategy)
job once, re-shaping the links in place between rates, including the unshaped rate (same CPU budget, no
link limit) whose compute-only times the physical bound needs. Round *r* runs the jobs in forward order
when *r* is even and reversed when odd, so slow drift of the machine favours no job, and a ratio can be
taken from the runs of one round, minutes apart at most (``stats.paired_ratio``).

Pipelined jobs run on one stage cut per (model, stage count): the first such run profiles and cuts, and
every later run of that model is given the same layer counts (``--pipeline.split``), so strategies that
differ only in schedule run on the same stages (torch's interleaved and zero-bubble peers, two stages per
rank, share a cut of their own).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from ..cluster.emulate import HOST_INTERFACE, EmulatedCluster, HostFailed
from ..pipeline.schedules import chunks
from .scenarios import Scenario

UNSHAPED = "unshaped"


def _rates(scn: Scenario, hosts: int) -> list[str]:
    return [UNSHAPED] if hosts == 1 else [UNSHAPED, *scn.rates] if scn.unshaped else list(scn.rates)


def _round(scn: Scenario, rates: list[str], repeat: int) -> list[tuple[str, str, str]]:
    jobs = [(rate, m, s) for rate in rates for m in scn.models for s in scn.strategies]
    return jobs if repeat % 2 == 0 else jobs[::-1]


def _flag(args: list[str], name: str) -> str | None:
    """The value the last ``name`` in ``args`` sets (as tessel train reads it), or None."""
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    return found[-1] if found else None


def split_of(summary: dict[str, Any]) -> str | None:
    """A pipelined run's stage cut as layer counts per stage, e.g. '3,3,2,2' (None for other runs)."""
    bounds = (summary.get("pipeline") or {}).get("plan_bounds")
    return ",".join(str(hi - lo) for lo, hi in bounds) if bounds else None


def _record(summary: dict[str, Any], **keys) -> dict[str, Any]:
    steps = max(summary["steps_run"], 1)
    sent_max = sum(v["sent_max_rank_total"] for v in summary["bytes"].values()) / steps
    return {
        **keys,
        "step_time": summary["median_step_time"],
        "step_times": summary.get("step_times"),  # each timed step: how much one step differs from the next
        "throughput": summary["median_tokens_per_s"],
        "unit": summary["unit"],
        "bytes_per_step": {c: v["sent_per_step_per_rank"] for c, v in summary["bytes"].items()},
        "max_rank_sent_per_step": sent_max,
        # the busiest host's interface (headers included; a host's ranks each read it), torch's traffic too
        "wire_max_host_per_step": max(summary["wire_sent_per_rank"]) / steps if summary.get("wire_sent_per_rank")
        else None,
        "peak_mem": max(summary.get("peak_mem_per_rank") or [0]),
        "table_mem": max(summary.get("table_mem_per_rank") or [0]),
        "state_mem": max(summary.get("state_mem_per_rank") or [0]),
        "final_loss": summary["final_loss"],
        "sparse_hidden": summary.get("sparse_hidden"),
        "sparse_comm": summary.get("sparse_comm_per_step"),
        "sparse_waits": summary.get("sparse_waits_per_step"),
        "sparse_work": summary.get("sparse_work_per_step"),
        "sparse_plan": summary.get("sparse_plan") or {},
        "pipeline": summary.get("pipeline"),
        "act_mem": max((m for m in summary.get("activation_mem_per_rank") or [] if m), default=None),
        "tensor": summary.get("tensor"),
        "tensor_formula": summary.get("tensor_formula"),
    }


RUN_NAME = re.compile(r"^(?P<model>[a-z0-9_]+)-(?P<strategy>.+)-h(?P<hosts>\d+)-(?P<rate>[^-]+)-r(?P<repeat>\d+)$")


def run_dir(out: Path, model: str, strategy: str, hosts: int, rate: str, repeat: int) -> Path:
    """Where one run of a benchmark writes (RUN_NAME reads the name back)."""
    return out / "runs" / f"{model}-{strategy}-h{hosts}-{rate}-r{repeat}"


def records_from_runs(out: Path) -> list[dict[str, Any]]:
    """The records of every finished run under ``out/runs`` (to rebuild a report after an interruption)."""
    records = []
    for d in sorted((out / "runs").glob("*")):
        m = RUN_NAME.match(d.name)
        if m and (d / "summary.json").is_file():
            records.append(_record(json.loads((d / "summary.json").read_text()), model=m["model"],
                                   strategy=m["strategy"], hosts=int(m["hosts"]), rate=m["rate"],
                                   repeat=int(m["repeat"])))
    return records


def fill_step_times(records: list[dict[str, Any]], out: Path) -> None:
    """Give records saved before they carried step times those of their run's metrics.jsonl, where it is kept."""
    from ..train.metrics import timed_steps

    for r in records:
        path = run_dir(out, r["model"], r["strategy"], r["hosts"], r["rate"], r["repeat"]) / "metrics.jsonl"
        if r.get("step_times") is None and path.is_file():
            steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            r["step_times"] = [x["step_time"] for x in timed_steps(steps)]


def _eta(t0: float, done: int, total: int) -> float:
    return (time.monotonic() - t0) / done * (total - done) / 60


def run_scenario(scn: Scenario, out: Path, repeats: int = 3, prefix: str = "tslb",
                 log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> list[dict[str, Any]]:
    """All runs of ``scn``; each record holds one run's medians (over its steps after warm-up)."""
    records: list[dict[str, Any]] = []
    total = sum(repeats * len(_rates(scn, h)) * len(scn.models) * len(scn.strategies) for h in scn.hosts)
    done, t0 = 0, time.monotonic()
    for hosts in scn.hosts:
        rates = _rates(scn, hosts)
        cuts: dict[tuple[str, str], str] = {}  # (model, pp) -> the split every pipelined run of it gets
        with EmulatedCluster(hosts, rate=None, prefix=prefix, **scn.cluster) as emu:
            for repeat in range(repeats):
                for rate, model, strategy in _round(scn, rates, repeat):
                    if emu.rate != (None if rate == UNSHAPED else rate):
                        emu.set_rate(None if rate == UNSHAPED else rate)
                    where = run_dir(out, model, strategy, hosts, rate, repeat)
                    args = ["-m", "tessel", "train", "--metrics.interface", HOST_INTERFACE, *scn.common,
                            *scn.models[model], *scn.strategies[strategy], "--steps", str(scn.steps),
                            "--out", str(where.resolve())]
                    pp = _flag(args, "--pp")
                    # torch's interleaved and zero-bubble peers cut twice as many stages: their own cut
                    cut = (model, pp, chunks(_flag(args, "--pipeline.schedule") or "1f1b"))
                    if pp not in (None, "1") and cut in cuts and _flag(args, "--pipeline.split") is None:
                        args += ["--pipeline.split", cuts[cut]]
                    done += 1
                    try:
                        emu.run(emu.torchrun_commands(args, run_id=f"b{done}"), timeout=900)
                    except HostFailed as e:
                        # One failed run must not throw away the others: report it, keep what the hosts said
                        # (torchrun's own last line is a banner, not the error), and go on.
                        where.mkdir(parents=True, exist_ok=True)
                        for r in e.results:
                            (where / f"host{r.host}.stderr").write_text(r.stderr or "")
                        oom = any(r.out_of_memory for r in e.results)
                        if oom:  # the plan does not fit the hosts' memory: a result, not an error
                            records.append({"model": model, "strategy": strategy, "hosts": hosts, "rate": rate,
                                            "repeat": repeat, "did_not_fit": True, "memory": emu.memory})
                        log(f"[{done}/{total}] {where.name} {'DID NOT FIT' if oom else 'FAILED'}: "
                            f"{str(e).splitlines()[0]} (stderr of each host in {where})")
                        continue
                    summary = json.loads((where / "summary.json").read_text())
                    if pp not in (None, "1") and cut not in cuts and split_of(summary):
                        cuts[cut] = split_of(summary)
                        log(f"{model} on {len(cuts[cut].split(','))} stages: every later run is given this run's "
                            f"cut {cuts[cut]}")
                    rec = _record(summary, model=model, strategy=strategy, hosts=hosts, rate=rate, repeat=repeat)
                    records.append(rec)
                    log(f"[{done}/{total}] {model:<15} {strategy:<11} hosts={hosts} {rate:<8} rep {repeat}: "
                        f"{rec['step_time'] * 1000:8.1f} ms/step  (about {_eta(t0, done, total):.0f} min left)")
    return records
