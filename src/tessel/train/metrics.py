"""Per-step metrics of a run: JSONL file, progress display, final summary table, plot, TensorBoard.

Only rank 0 writes or prints; every rank computes the same numbers (losses and byte counts are
gathered before they get here).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from array import array
from pathlib import Path
from typing import Any


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def timed_steps(records: list) -> list:
    """The steps a run's medians are taken over: all but the first 3 (warm-up) when there are more than 4.

    >>> timed_steps([1, 2, 3, 4, 5, 6])
    [4, 5, 6]
    """
    return records[min(3, len(records) - 1):] if len(records) > 4 else records


WAIT_PREFIX = "sparse_wait_"  # a step record's seconds the trainer waited for the tables, one key per kind


class Series:
    """What the summary and the plot need of each step, as flat columns of floats: a long run keeps 56 bytes a
    step here, not every step's record (100,000 steps of records were ~200 MB on the logging rank).

    >>> s = Series()
    >>> s.add({"step": 1, "loss": 2.5, "tokens_per_s": 10.0, "step_time": 0.1})
    >>> len(s), s["loss"][0], math.isnan(s["rss"][0])
    (1, 2.5, True)
    """

    COLUMNS = ("step", "loss", "tokens_per_s", "step_time", "sparse_busy", "sparse_work", "rss")

    def __init__(self) -> None:
        self.cols = {k: array("d") for k in self.COLUMNS}

    def add(self, record: dict[str, Any]) -> None:
        for k in record:  # the tables' waits by kind: a column from the first step that has it
            if k.startswith(WAIT_PREFIX) and k not in self.cols:
                self.cols[k] = array("d", [math.nan] * len(self))
        for k, col in self.cols.items():
            v = record.get(k)
            col.append(math.nan if v is None else float(v))

    def waits(self) -> list[str]:
        """The kinds of wait the tables recorded (see :data:`tessel.sparse.schedule.WAITS`)."""
        return [k[len(WAIT_PREFIX):] for k in self.cols if k.startswith(WAIT_PREFIX)]

    def __getitem__(self, key: str) -> array:
        return self.cols[key]

    def __len__(self) -> int:
        return len(self.cols["step"])


def _mean_over(col: array, steps: list[int]) -> float:
    """Mean of ``col`` over ``steps``, a step without the value (nan: that wait did not happen) as 0."""
    return sum(0.0 if math.isnan(col[i]) else col[i] for i in steps) / len(steps)


def _keep_steps_upto(path: Path, step: int) -> None:
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the crash that led to this resume
    tmp = path.with_name(path.name + ".part")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class MetricsLogger:
    """Collects step records; ``log_step`` each step, ``close`` once at the end (returns the summary)."""

    def __init__(self, out: str | Path, steps: int, start_step: int = 0, progress: str = "auto",
                 log_every: int = 10, tensorboard: bool = False, enabled: bool = True, resume: bool = False,
                 rank: int = 0) -> None:
        self.out, self.enabled, self.log_every = Path(out), enabled, log_every
        self.series = Series()
        self.sparse = False  # whether steps carry the sparse tables' timing
        self.t0 = time.perf_counter()
        self.bar = self.tb = self.jsonl = self.memory = None
        self.out.mkdir(parents=True, exist_ok=True)
        if not enabled:
            # every other rank keeps its own memory over time, every log_every steps (the logging rank's is in
            # metrics.jsonl): growth on one rank, and whether its allocator or only its resident set grows, shows
            self.memory = self._open(f"memory-rank{rank}.jsonl", start_step, resume)
            return
        self.jsonl = self._open("metrics.jsonl", start_step, resume)
        mode = progress if progress != "auto" else ("bar" if sys.stderr.isatty() else "log")
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        self.mode = mode
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.out / "tb"))
            except ImportError:
                print("tessel: tensorboard is not installed (pip install 'tessel[tensorboard]'); "
                      "logging to metrics.jsonl only", file=sys.stderr)

    def _open(self, name: str, start_step: int, resume: bool):
        if resume:  # steps after the checkpoint are trained again: their earlier records go
            _keep_steps_upto(self.out / name, start_step)
        return open(self.out / name, "a" if resume else "w")

    def log_step(self, record: dict[str, Any]) -> None:
        self.series.add(record)
        self.sparse = self.sparse or "sparse_busy" in record
        if not self.enabled:
            if self.memory is not None and record["step"] % self.log_every == 0:
                self.memory.write(json.dumps({k: record.get(k) for k in ("step", "rss", "anon", "heap")}) + "\n")
                self.memory.flush()
            return
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        step = record["step"]
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
        elif self.mode == "log" and (step % self.log_every == 0 or step == 1):
            print(f"step {step:>6}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                  f"{record['tokens_per_s']:>9.0f} tok/s  {record['step_time'] * 1000:7.1f} ms/step", flush=True)
        if self.tb is not None:
            for key in ("loss", "lr", "tokens_per_s", "step_time", "grad_norm"):
                self.tb.add_scalar(f"train/{key}", record[key], step)

    def summary(self, bytes_per_rank: list[dict[str, dict[str, int]]], extra: dict[str, Any]) -> dict[str, Any]:
        """Aggregate the run: medians skip the first steps (warm-up) when there are enough."""
        s, n = self.series, len(self.series)
        timed = timed_steps(range(n))  # indices of the steps the medians are over
        steps = max(n, 1)
        channels = sorted({c for r in bytes_per_rank for c in r})
        per_channel = {
            c: {
                "sent_per_step_per_rank": statistics.mean(r.get(c, {}).get("sent", 0) for r in bytes_per_rank) / steps,
                "recv_per_step_per_rank": statistics.mean(r.get(c, {}).get("recv", 0) for r in bytes_per_rank) / steps,
                "sent_max_rank_total": max(r.get(c, {}).get("sent", 0) for r in bytes_per_rank),
            }
            for c in channels
        }
        out = {
            **extra,
            "steps_run": n,
            "first_loss": s["loss"][0] if n else None,
            "final_loss": statistics.mean(s["loss"][-5:]) if n else None,
            "median_step_time": statistics.median(s["step_time"][i] for i in timed) if n else None,
            "step_times": [s["step_time"][i] for i in timed],  # what the median is of: a benchmark's jitter
            "median_tokens_per_s": statistics.median(s["tokens_per_s"][i] for i in timed) if n else None,
            "wall_time": time.perf_counter() - self.t0,
            "bytes": per_channel,
        }
        if timed and self.sparse:
            busy = _mean_over(s["sparse_busy"], timed)
            # where the tables' part of a step goes: each wait by what it waited for, and their own work
            waits = {k: _mean_over(s[WAIT_PREFIX + k], timed) for k in s.waits()}
            out["sparse_comm_per_step"] = busy
            # share of the alltoall tables' communication time the trainer did not wait for
            out["sparse_hidden"] = max(0.0, 1 - sum(waits.values()) / busy) if busy > 0 else None
            out["sparse_waits_per_step"] = waits
            out["sparse_work_per_step"] = _mean_over(s["sparse_work"], timed)
        return out

    def close(self, summary: dict[str, Any]) -> None:
        if self.memory is not None:
            self.memory.close()
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        self.jsonl.close()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(format_summary(summary), flush=True)
        if summary.get("plot", True):
            plot(self.series, self.out / "loss.png", summary.get("unit", "tokens"))


def _tables_line(s: dict[str, Any]) -> str:
    """Where the alltoall tables' part of a step went: the waits by kind, and their own work."""
    if s.get("sparse_waits_per_step") is None:
        return ""
    waits = ", ".join(f"{k.replace('_', ' ')} {v * 1000:.1f}" for k, v in s["sparse_waits_per_step"].items())
    return f"  tables' time    waited for {waits or 'nothing'}; own work {s['sparse_work_per_step'] * 1000:.1f} ms/step"


def format_summary(s: dict[str, Any]) -> str:
    unit = s.get("unit", "tokens")
    lines = [
        "",
        f"tessel run summary  ({s.get('model')}, {s.get('dims')}, {s.get('precision', 'fp32')}, {s['steps_run']} steps "
        f"in {s['wall_time']:.1f} s)",
        f"  loss            {s['first_loss']:.4f} -> {s['final_loss']:.4f}" if s["first_loss"] is not None else "",
        f"  {unit}/s        {s['median_tokens_per_s']:.0f} (median over steps)",
        f"  step time       {s['median_step_time'] * 1000:.1f} ms (median)",
        f"  peak memory     {human_bytes(max(s['peak_mem_per_rank']))} (largest rank)" if s.get("peak_mem_per_rank")
        else "",
        _memory_line(s),
        f"  sparse comm     {s['sparse_comm_per_step'] * 1000:.1f} ms/step, {s['sparse_hidden']:.0%} hidden behind "
        "compute" if s.get("sparse_hidden") is not None else "",
        _tables_line(s),
        _pipeline_line(s.get("pipeline")),
        "  bytes per channel, per step per rank:",
        f"    {'channel':<12} {'sent':>12} {'received':>12}",
    ]
    for c, v in s["bytes"].items():
        lines.append(f"    {c:<12} {human_bytes(v['sent_per_step_per_rank']):>12} "
                     f"{human_bytes(v['recv_per_step_per_rank']):>12}")
    if s.get("out"):
        lines.append(f"  metrics, summary and plot in {s['out']}")
    return "\n".join(line for line in lines if line)


def _memory_line(s: dict[str, Any]) -> str:
    """The fullest rank's tensors at their peak, measured in one step, beside the planner's prediction for it."""
    measured = [m for m in s.get("step_peak_mem_per_rank") or [] if m is not None]
    if not measured:
        return ""
    rank = s["step_peak_mem_per_rank"].index(max(measured))
    predicted = (s.get("predicted_mem_per_rank") or [None] * (rank + 1))[rank]
    line = f"  tensors at peak {human_bytes(max(measured))} measured (rank {rank}, one step)"
    if predicted:
        line += f", {human_bytes(predicted)} predicted ({(predicted - max(measured)) / max(measured):+.1%})"
    return line


def _pipeline_line(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    bubble = f"bubble {p['bubble']:.0%} (measured idle share)" if p.get("bubble") is not None else "bubble n/a"
    kept = max(p.get("kept_bytes_per_rank") or [0])
    m = p['micro_batches']
    return (f"  pipeline        {p['schedule']}, {m} micro-batch{'es' if m != 1 else ''}, {bubble}"
            + (f", stage imbalance {p['busy_imbalance']:.2f}x" if p.get("busy_imbalance") else "")
            + (f", weight copies kept {human_bytes(kept)} (largest rank)" if kept else ""))


def plot(series: Series, path: Path, unit: str = "tokens") -> bool:
    """Loss, throughput and resident memory over steps as a PNG; False (with a note) when matplotlib is
    missing. Memory is drawn so that growth over a long run shows, not only its peak at the end."""
    if not len(series):
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("tessel: matplotlib is not installed (pip install 'tessel[plot]'); no loss.png", file=sys.stderr)
        return False
    steps = series["step"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 3.6))
    a.plot(steps, series["loss"], lw=1)
    a.set(xlabel="step", ylabel="loss", title="training loss")
    b.plot(steps, series["tokens_per_s"], lw=1, color="tab:green")
    b.set(xlabel="step", ylabel=f"{unit}/s (whole job)", title="throughput")
    c.plot(steps, [v / 2**20 for v in series["rss"]], lw=1, color="tab:red")
    c.set(xlabel="step", ylabel="MiB", title="resident memory (logging rank)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
