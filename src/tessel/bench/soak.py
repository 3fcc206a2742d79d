"""``tessel bench soak``: does a long run's memory stay flat? The default model for thousands of steps per
table strategy on emulated hosts, every worker's resident memory sampled from outside, and its slope per step.

A worker that keeps a little of every step grows linearly; one that keeps nothing levels off after warm-up
(the allocator's pools fill, then are reused). Each worker's resident set is read from ``/proc`` every few
seconds by the benchmark itself, not reported by the code under test, beside the step the run had reached
(the logging rank's ``metrics.jsonl``). The slope is a least-squares fit over the samples after warm-up; its
95% interval uses Newey–West standard errors, because neighbouring samples are not independent (a pool that
grows once lifts every later sample).

    sudo tessel bench soak --steps 5000 --doc docs/benchmarks.md
    sudo tessel bench soak --steps 1500 --strategies alltoall,ps --hosts 2 --rates 1gbit
"""

from __future__ import annotations

import json
import math
import os
import shlex
import threading
import time
from pathlib import Path

STRATEGIES = {
    "dense": ["--sparse", "dense"],
    "ps": ["--sparse", "ps"],
    "allgather": ["--sparse", "allgather"],
    "alltoall": ["--sparse", "alltoall"],  # scheduled: the default run's choice for its token table
    "alltoall-unsched": ["--sparse", "alltoall", "--sparse.schedule", "false"],
}
WARMUP = 0.2  # the share of steps left out of the fit: pools and caches fill there
SAMPLE_S = 5.0


def worker_pids(pids: list[int]) -> list[int]:
    """Of a host's processes, the training workers (torchrun gives them LOCAL_RANK; its agent has none)."""
    out = []
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"LOCAL_RANK=") for e in env):
            out.append(pid)
    return out


def rss_bytes(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def anon_bytes(pid: int) -> int | None:
    """The anonymous part of the resident set (``RssAnon``): memory the process allocated. The rest is pages of
    mapped files (torch's libraries), the page cache's to drop and read again under the host's memory limit."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def last_step(metrics: Path) -> int | None:
    """The step the logging rank last wrote (its metrics.jsonl), or None before the first."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [x for x in f.read().splitlines() if x.strip()]
        for line in reversed(lines):
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError):
                continue  # a line being written
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    """Every ``every`` seconds: (step, RSS of each host's worker) in ``samples``, and (step, its anonymous part)
    in ``anon``, while a run goes on."""

    def __init__(self, emu, metrics: Path, every: float = SAMPLE_S) -> None:
        super().__init__(daemon=True)
        self.emu, self.metrics, self.every = emu, metrics, every
        self.samples: list[tuple[int, list[int | None]]] = []
        self.anon: list[tuple[int, list[int | None]]] = []
        self.done = threading.Event()

    def _procs(self, host: int) -> list[int]:
        try:
            return [int(p) for p in (self.emu.cgroup(host) / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def run(self) -> None:
        while not self.done.wait(self.every):
            step = last_step(self.metrics)
            if step is None:
                continue
            workers = [worker_pids(self._procs(h)) for h in range(self.emu.hosts)]
            self.samples.append((step, [rss_bytes(w[0]) if w else None for w in workers]))
            self.anon.append((step, [anon_bytes(w[0]) if w else None for w in workers]))


def slope(steps: list[float], values: list[float]) -> tuple[float, float, float]:
    """(least-squares slope, 95% interval low, high) of ``values`` over ``steps``, with Newey–West (Bartlett)
    standard errors at a bandwidth of sqrt(n) samples: serial correlation widens the interval, not narrows it.

    >>> b, lo, hi = slope([0, 1, 2, 3, 4, 5], [1.0, 3.0, 5.0, 7.0, 9.0, 11.0])
    >>> round(b, 6), round(hi - lo, 6)
    (2.0, 0.0)
    """
    import numpy as np
    from scipy import stats

    x, y = np.asarray(steps, float), np.asarray(values, float)
    n = len(x)
    xc = x - x.mean()
    sxx = float(xc @ xc)
    b = float(xc @ (y - y.mean())) / sxx
    u = xc * (y - y.mean() - b * xc)  # score contributions
    lag = min(n - 1, math.ceil(math.sqrt(n)))
    s = float(u @ u)
    for k in range(1, lag + 1):
        s += 2 * (1 - k / (lag + 1)) * float(u[k:] @ u[:-k])
    se = math.sqrt(max(s, 0.0)) / sxx
    t = float(stats.t.ppf(0.975, max(n - 2, 1)))
    return b, b - t * se, b + t * se


def fit(samples: list[tuple[int, list[int | None]]], steps: int) -> list[dict]:
    """Per host: slope of its worker's RSS in MB per step over the samples after warm-up."""
    out = []
    hosts = max((len(s[1]) for s in samples), default=0)
    for h in range(hosts):
        pts = [(st, rss[h]) for st, rss in samples if st > WARMUP * steps and rss[h] is not None]
        if len(pts) < 4:
            out.append({"host": h, "samples": len(pts)})
            continue
        b, lo, hi = slope([p[0] for p in pts], [p[1] / 1e6 for p in pts])
        out.append({"host": h, "samples": len(pts), "slope": b, "low": lo, "high": hi,
                    "first_mb": pts[0][1] / 1e6, "last_mb": pts[-1][1] / 1e6, "first_step": pts[0][0],
                    "last_step": pts[-1][0]})
    return out


def heap_fit(metrics: Path, steps: int) -> dict | None:
    """A rank's allocator bytes in use (``heap``: the logging rank's in metrics.jsonl, every other rank's in its
    memory-rank<r>.jsonl): its slope after warm-up. Flat beside a growing resident set means free pages held."""
    try:
        recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return None
    pts = [(r["step"], r["heap"] / 1e6) for r in recs if r.get("heap") is not None and r["step"] > WARMUP * steps]
    if len(pts) < 4:
        return None
    pts = pts[:: max(1, len(pts) // 400)]  # a few hundred points are plenty for the fit
    b, lo, hi = slope([p[0] for p in pts], [p[1] for p in pts])
    return {"slope": b, "low": lo, "high": hi, "first_mb": pts[0][1], "last_mb": pts[-1][1]}


def heap_fits(where: Path, ranks: int, steps: int) -> list[dict | None]:
    """Every rank's :func:`heap_fit`, by rank (rank 0 logs)."""
    return [heap_fit(where / ("metrics.jsonl" if r == 0 else f"memory-rank{r}.jsonl"), steps) for r in range(ranks)]


def verdict(row: dict) -> str:
    """Flat where the interval includes 0 or lies under 0.01 MB per step (a 100,000-step run gains < 1 GB)."""
    if "slope" not in row:
        return "too few samples"
    if row["low"] <= 0 <= row["high"]:
        return "flat (interval includes 0)"
    if row["high"] < 0.01:
        return "flat (under 0.01 MB/step)"
    return "grows"


def _heap_text(heap: dict | None) -> str:
    return f"{heap['slope']:+.5f} ({heap['low']:+.5f} to {heap['high']:+.5f})" if heap else "—"


def _fit_text(h: dict) -> tuple[str, str]:
    """(first → last MB, slope with its interval) of one host's fit, or dashes without one."""
    if "slope" not in h:
        return "—", "—"
    return (f"{h['first_mb']:.0f} (step {h['first_step']}) → {h['last_mb']:.0f} (step {h['last_step']})",
            f"{h['slope']:+.5f} ({h['low']:+.5f} to {h['high']:+.5f})")


def table(runs: list[dict]) -> list[str]:
    """Per strategy and host: the resident set and its anonymous part (the verdict is on the anonymous part where
    it was sampled: file-backed pages are the page cache's, shared and dropped under memory pressure)."""
    lines = ["| strategy | host | RSS after warm-up → end (MB) | RSS slope, MB/step (95% interval) | anonymous RSS "
             "after warm-up → end (MB) | anonymous slope, MB/step (95% interval) | samples | allocator bytes in "
             "use: slope (95% interval) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if r.get("failed"):
            lines.append(f"| {r['strategy']} | — | — | — | — | — | — | — | failed: {r['failed']} |")
            continue
        # by rank (hosts need not take ranks in order); runs saved before every rank recorded it have rank 0's
        heaps = r.get("heaps") or [r.get("heap")]
        anon = r.get("anon") or [{"host": h["host"]} for h in r["hosts"]]
        for h, a in zip(r["hosts"], anon):
            heap = f"rank {h['host']}: {_heap_text(heaps[h['host']])}" if h["host"] < len(heaps) else ""
            judged = a if "slope" in a else h
            lines.append(f"| {r['strategy']} | {h['host']} | {' | '.join(_fit_text(h))} | {' | '.join(_fit_text(a))} "
                         f"| {h['samples']} | {heap} | {verdict(judged)} |")
    return lines


def run(strategy: str, flags: list[str], emu, out: Path, steps: int, every: float) -> dict:
    from ..cluster.emulate import HostFailed

    where = out / "runs" / strategy
    metrics = where / "metrics.jsonl"
    if metrics.exists():
        metrics.unlink()  # the sampler reads the step from here: never from an earlier run's file
    args = ["-m", "tessel", "train", *flags, "--steps", str(steps), "--metrics.progress", "log",
            "--metrics.plot", "false", "--metrics.heldout", "false", "--timeout", "120", "--out", str(where.resolve())]
    sampler = Sampler(emu, metrics, every)
    sampler.start()
    t0 = time.monotonic()
    failed = None
    try:
        emu.run(emu.torchrun_commands(args, run_id=f"soak-{strategy}"), timeout=max(900.0, steps * 5.0))
    except HostFailed as e:
        failed = str(e).splitlines()[0]
    finally:
        sampler.done.set()
        sampler.join()
    row = {"strategy": strategy, "flags": flags, "seconds": time.monotonic() - t0, "samples": sampler.samples,
           "hosts": fit(sampler.samples, steps), "anon_samples": sampler.anon, "anon": fit(sampler.anon, steps),
           "heaps": heap_fits(where, emu.hosts, steps)}
    if failed:
        row["failed"] = failed
    return row


def _saved(out: Path) -> dict:
    from ..errors import ConfigError

    try:
        saved = json.loads((out / "results.json").read_text())
        if not all(k in saved for k in ("steps", "hosts", "rate", "runs")):
            raise KeyError("steps, hosts, rate or runs")
        return saved
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{out / 'results.json'} is not a soak tessel wrote ({str(e)[:80]}); run 'tessel bench "
                          "soak' first") from None


def main(ns, argv: list[str], check_paths) -> int:
    """``tessel bench soak``: run each strategy in turn, then write results.json, report.md (and ``--doc``)."""
    from ..cluster.emulate import EmulatedCluster, parse_rate
    from ..errors import ConfigError
    from .report import update_doc

    steps = ns.steps or 5000
    if steps < 50:
        raise ConfigError(f"--steps {steps} is too short to tell growth from warm-up; give at least 50, e.g. 5000")
    chosen = [s.strip() for s in (ns.strategies or ",".join(STRATEGIES)).split(",") if s.strip()]
    bad = [s for s in chosen if s not in STRATEGIES]
    if bad:
        raise ConfigError(f"--strategies {','.join(bad)} not in the soak; valid: {', '.join(STRATEGIES)}")
    hosts = int(ns.hosts or 2)
    rate = (ns.rates or "1gbit").split(",")[0].strip()
    parse_rate(rate)
    out = Path(ns.out or "bench/soak")
    check_paths(out, ns.doc)
    every = SAMPLE_S
    saved = _saved(out) if ns.report_only or ns.append else None
    if ns.report_only:  # run nothing: the saved runs, as they were measured
        steps, hosts, rate, runs = saved["steps"], saved["hosts"], saved["rate"], saved["runs"]
        argv, earlier = saved.get("argv", argv), saved.get("kept", [])
    else:
        # --append keeps the saved runs of the strategies this invocation does not redo, in the soak's order
        kept = {r["strategy"]: r for r in (saved or {}).get("runs", []) if r["strategy"] not in chosen}
        earlier, runs = [k for k in STRATEGIES if k in kept], []
        with EmulatedCluster(hosts, rate=rate, prefix="tsoak") as emu:
            for s in chosen:
                print(f"soak: {s}, {steps} steps on {hosts} hosts at {rate}", flush=True)
                runs.append(run(s, STRATEGIES[s], emu, out, steps, every))
                both = {**kept, **{r["strategy"]: r for r in runs}}
                runs_now = [both[k] for k in STRATEGIES if k in both]
                (out / "results.json").write_text(json.dumps({"steps": steps, "hosts": hosts, "rate": rate,
                                                              "argv": argv, "kept": earlier, "runs": runs_now}))
        runs = runs_now
    text = "\n".join([
        f"Reproduce: `tessel {' '.join(shlex.quote(a) for a in argv)}` ({time.strftime('%Y-%m-%d')}). The default "
        f"model (`tessel train`'s defaults) for {steps} steps per strategy, {hosts} emulated hosts at {rate}, one "
        f"worker each; each worker's resident set and its anonymous part read from /proc every {every:g} s (the "
        "verdict is on the anonymous part where it was sampled); slope fitted over the steps "
        f"after the first {WARMUP:.0%}, 95% interval from Newey–West standard errors (bandwidth sqrt(n))."
        + (f" The runs of {', '.join(earlier)} are kept from an earlier invocation (`--append`)." if earlier else ""),
        "",
        *table(runs), ""])
    (out / "report.md").write_text(text)
    if ns.doc:
        update_doc(Path(ns.doc), "soak", text)
    print(text)
    return 0
