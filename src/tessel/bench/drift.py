"""How much the machine alone moves a benchmark run: a fixed workload's speed over time, and the spread it gives.

Every core runs the same fixed single-thread GEMM loop (one process pinned to each core, as the emulated hosts
share them); each window records how many GEMMs finished. Nothing changes from one window to the next but the
machine, so a slower window is the machine being slower (a virtual CPU losing its physical one, whatever
the guest's steal counter says). From that speed series, ``floor`` asks what spread ((max − min) ÷ median)
three runs of a given length would show if their work were fixed and only the machine varied: the spread a
benchmark cell cannot go below on this machine, whatever the emulator does.

    sudo tessel bench drift --seconds 120 --doc docs/benchmarks.md
"""

from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import time
from dataclasses import dataclass

WINDOW_S = 0.05


def _worker(seconds: float, window: float, core: int, out) -> None:
    import os

    import torch

    os.sched_setaffinity(0, {core})  # one core each: a virtual CPU may be slower than its sibling
    torch.set_num_threads(1)  # one intra-op thread, as every benchmark worker
    a = torch.randn(96, 96)
    done, counts, start = 0, [], time.perf_counter()
    edge = start + window
    while True:
        torch.mm(a, a)  # ~40 µs: many per window, so a window's count is its speed
        done += 1
        now = time.perf_counter()
        if now >= edge:
            counts.append(done / (now - edge + window))
            done, edge = 0, now + window
            if now - start >= seconds:
                break
    out.put((core, counts))


def _steal() -> int:
    """Jiffies the hypervisor says it took from this guest (/proc/stat's 8th cpu field)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def probe(seconds: float, cores: list[int], window: float = WINDOW_S) -> tuple[list[float], int, list[float]]:
    """(the machine's speed per window, mean over the cores and normalised to its 95th percentile; steal
    jiffies during the probe; each core's median speed over the fastest core's)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(seconds, window, core, q)) for core in cores]
    steal = _steal()
    for p in procs:
        p.start()
    series = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    n = min(len(s) for s in series.values())
    mean = [statistics.fmean(s[i] for s in series.values()) for i in range(n)]
    top = sorted(mean)[int(0.95 * (n - 1))]
    per_core = [statistics.median(series[c]) for c in cores]
    return [v / top for v in mean], _steal() - steal, [v / max(per_core) for v in per_core]


def run_time(speeds: list[float], start: int, work: float) -> float:
    """Windows a fixed ``work`` (in full-speed windows) takes from window ``start`` at these speeds.

    >>> run_time([1.0, 0.5, 0.5, 1.0], 0, 2.0)   # 1 + 0.5 + 0.5: three windows
    3.0
    """
    t, i = 0.0, start
    while work > 1e-12:
        step = min(work, speeds[i % len(speeds)])
        t += step / speeds[i % len(speeds)]
        work -= step
        i += 1
    return t


@dataclass(frozen=True)
class Floor:
    """The spread of ``runs`` runs of ``run_s`` seconds from the machine alone, over random starts."""

    run_s: float
    median: float  # median spread over the trials
    p90: float
    share_over_5: float  # share of trials whose spread exceeds 5%


def floor(speeds: list[float], run_s: float, window: float = WINDOW_S, runs: int = 3, trials: int = 2000,
          seed: int = 0) -> Floor:
    """Three runs of the same fixed work, started at random windows of the probe: their spread.

    >>> f = floor([1.0] * 100, run_s=1.0)   # a steady machine: no spread at all
    >>> f.median, f.share_over_5
    (0.0, 0.0)
    """
    rng = random.Random(seed)
    work = run_s / window
    spreads = []
    for _ in range(trials):
        times = [run_time(speeds, rng.randrange(len(speeds)), work) for _ in range(runs)]
        spreads.append((max(times) - min(times)) / statistics.median(times))
    spreads.sort()
    return Floor(run_s, statistics.median(spreads), spreads[int(0.9 * (trials - 1))],
                 sum(s > 0.05 for s in spreads) / trials)


def summary(speeds: list[float], steal: int, seconds: float, workers: int, run_lengths: list[float],
            per_core: list[float] | None = None) -> list[str]:
    """The probe as Markdown: the speed distribution, each core's speed, and the spread floor per run length."""
    q = sorted(speeds)
    pct = (lambda p: q[int(p * (len(q) - 1))])
    slow = sum(v < 0.8 for v in speeds) / len(speeds)
    cores = f" Median speed of each core over the fastest's: {', '.join(f'{v:.2f}' for v in per_core)}." \
        if per_core else ""
    lines = [f"{workers} processes (one pinned to each core) ran a fixed single-thread GEMM loop for {seconds:g} s; "
             f"speed per {WINDOW_S * 1000:g} ms window over its 95th percentile: min {q[0]:.2f}, 5th percentile "
             f"{pct(0.05):.2f}, median {pct(0.5):.2f}; {slow:.0%} of windows below 0.8. Steal time the guest was "
             f"told of: {steal / 100:.2f} s of {seconds * workers:g} CPU-s.{cores}", "",
             "| run length | machine-alone spread of 3 runs: median | 90th percentile | runs over 5% |",
             "|---|---|---|---|"]
    for s in run_lengths:
        f = floor(speeds, s)
        lines.append(f"| {s:g} s | {f.median:.1%} | {f.p90:.1%} | {f.share_over_5:.0%} |")
    return lines


def main(ns, argv: list[str], check_paths) -> int:
    """``tessel bench drift``: probe, then write results.json, report.md (and ``--doc``'s section)."""
    import json
    import math
    import os
    import shlex
    from pathlib import Path

    from ..errors import ConfigError
    from .report import update_doc

    if not (math.isfinite(ns.seconds) and 10 <= ns.seconds <= 3600):
        raise ConfigError(f"--seconds {ns.seconds:g} must be a number from 10 to 3600, e.g. 120")
    out = Path(ns.out or "bench/drift")
    check_paths(out, ns.doc)
    cores = sorted(os.sched_getaffinity(0))
    speeds, steal, per_core = probe(ns.seconds, cores)
    text = "\n".join([f"Reproduce (on an idle machine): `tessel {' '.join(shlex.quote(a) for a in argv)}`", "",
                      *summary(speeds, steal, ns.seconds, len(cores), [2, 5, 10, 20], per_core), ""])
    (out / "results.json").write_text(json.dumps({"window_s": WINDOW_S, "speeds": speeds, "steal": steal,
                                                  "per_core": per_core}))
    (out / "report.md").write_text(text)
    if ns.doc:
        update_doc(Path(ns.doc), "drift", text)
    print(text)
    return 0
