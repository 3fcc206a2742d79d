"""Run a scenario on emulated hosts: every strategy side by side, alternating order, repeated.

For each host count the runner brings up the hosts once per link rate, plus once unshaped (same CPU
budget, no link limit) for the compute-only time that the physical bound needs. Within one cluster,
repeat *r* runs the (model, strategy) jobs in forward order when *r* is even and reversed when odd, so
slow drift of the machine does not favour whichever runs first.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from ..cluster.emulate import EmulatedCluster, HostFailed
from .scenarios import Scenario

UNSHAPED = "unshaped"


def _job_order(scn: Scenario, repeat: int) -> list[tuple[str, str]]:
    jobs = [(m, s) for m in scn.models for s in scn.strategies]
    return jobs if repeat % 2 == 0 else jobs[::-1]


def _record(summary: dict[str, Any], **keys) -> dict[str, Any]:
    steps = max(summary["steps_run"], 1)
    sent_max = sum(v["sent_max_rank_total"] for v in summary["bytes"].values()) / steps
    return {
        **keys,
        "step_time": summary["median_step_time"],
        "throughput": summary["median_tokens_per_s"],
        "unit": summary["unit"],
        "bytes_per_step": {c: v["sent_per_step_per_rank"] for c, v in summary["bytes"].items()},
        "max_rank_sent_per_step": sent_max,
        "peak_mem": max(summary.get("peak_mem_per_rank") or [0]),
        "table_mem": max(summary.get("table_mem_per_rank") or [0]),
        "state_mem": max(summary.get("state_mem_per_rank") or [0]),
        "final_loss": summary["final_loss"],
        "sparse_hidden": summary.get("sparse_hidden"),
        "sparse_comm": summary.get("sparse_comm_per_step"),
        "sparse_plan": summary.get("sparse_plan") or {},
        "pipeline": summary.get("pipeline"),
        "act_mem": max((m for m in summary.get("activation_mem_per_rank") or [] if m), default=None),
        "tensor": summary.get("tensor"),
        "tensor_formula": summary.get("tensor_formula"),
    }


RUN_NAME = re.compile(r"^(?P<model>[a-z0-9_]+)-(?P<strategy>.+)-h(?P<hosts>\d+)-(?P<rate>[^-]+)-r(?P<repeat>\d+)$")


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


def _eta(t0: float, done: int, total: int) -> float:
    return (time.monotonic() - t0) / done * (total - done) / 60


def run_scenario(scn: Scenario, out: Path, repeats: int = 3, prefix: str = "tslb",
                 log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> list[dict[str, Any]]:
    """All runs of ``scn``; each record holds one run's medians (over its steps after warm-up)."""
    records: list[dict[str, Any]] = []
    configs = [(h, r) for h in scn.hosts
               for r in ([UNSHAPED] if h == 1 else [UNSHAPED, *scn.rates] if scn.unshaped else scn.rates)]
    total = sum(repeats * len(scn.models) * len(scn.strategies) for _ in configs)
    done, t0 = 0, time.monotonic()
    for hosts, rate in configs:
        cluster = EmulatedCluster(hosts, rate=None if rate == UNSHAPED else rate, prefix=prefix)
        with cluster:
            for repeat in range(repeats):
                for model, strategy in _job_order(scn, repeat):
                    run_dir = out / "runs" / f"{model}-{strategy}-h{hosts}-{rate}-r{repeat}"
                    args = ["-m", "tessel", "train", *scn.common, *scn.models[model], *scn.strategies[strategy],
                            "--steps", str(scn.steps), "--out", str(run_dir.resolve())]
                    done += 1
                    try:
                        cluster.run(cluster.torchrun_commands(args, run_id=f"b{done}"), timeout=900)
                    except HostFailed as e:
                        # One failed run must not throw away the others: report it and go on.
                        log(f"[{done}/{total}] {run_dir.name} FAILED: {str(e).splitlines()[0]}")
                        continue
                    rec = _record(json.loads((run_dir / "summary.json").read_text()), model=model,
                                  strategy=strategy, hosts=hosts, rate=rate, repeat=repeat)
                    records.append(rec)
                    log(f"[{done}/{total}] {model:<15} {strategy:<11} hosts={hosts} {rate:<8} rep {repeat}: "
                        f"{rec['step_time'] * 1000:8.1f} ms/step  (about {_eta(t0, done, total):.0f} min left)")
    return records
