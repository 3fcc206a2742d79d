"""The statistics of a benchmark cell: spread, and ratios with 95% confidence intervals.

The machine drifts over minutes, so a ratio between two strategies is taken from runs close in time: the
runner plays every job once per round (alternating order), and ``paired_ratio`` pairs the two strategies'
runs of the same round. Its interval is Student's t on the logs of the per-round ratios, so it is the
interval of their geometric mean; with one round there is no interval and the text says so.

    >>> r = paired_ratio({0: 2.0, 1: 2.2, 2: 1.8}, {0: 1.0, 1: 1.0, 2: 1.0})
    >>> r.text(), r.verdict()
    ('1.99x (1.55–2.56)', 'above')
    >>> paired_ratio({0: 1.0, 1: 1.1}, {0: 1.05, 1: 1.0}).verdict()
    'noise'
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

LEVEL = 0.95


@dataclass(frozen=True)
class Ratio:
    """A geometric-mean ratio over ``n`` paired rounds and its interval (nan bounds when n < 2)."""

    value: float
    low: float
    high: float
    n: int

    def verdict(self) -> str:
        """'above' or 'below' 1 only where the interval excludes 1; otherwise 'noise' (or 'one run')."""
        if self.n < 2:
            return "one run"
        return "above" if self.low > 1 else "below" if self.high < 1 else "noise"

    def text(self, unit: str = "x") -> str:
        if self.n < 2:
            return f"{self.value:.2f}{unit} (1 run, no interval)"
        return f"{self.value:.2f}{unit} ({self.low:.2f}–{self.high:.2f})"

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


def interval(ratios: list[float], level: float = LEVEL) -> Ratio:
    """Geometric mean of ``ratios`` (all > 0) with the t interval of their logs.

    >>> interval([1.2]).text()
    '1.20x (1 run, no interval)'
    """
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Ratio(math.exp(mean), math.nan, math.nan, len(logs))
    half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def paired_ratio(num: dict[int, float], den: dict[int, float], level: float = LEVEL) -> Ratio | None:
    """``num[r] / den[r]`` over the rounds ``r`` both ran; None when they share none."""
    rounds = sorted(set(num) & set(den))
    if not rounds or any(not num[r] > 0 or not den[r] > 0 for r in rounds):
        return None
    return interval([num[r] / den[r] for r in rounds], level)


def spread(values: list[float]) -> float:
    """(max - min) / median: the run-to-run spread the benchmark's goal is stated in (<= 5%).

    >>> round(spread([0.95, 1.0, 1.05]), 3)
    0.1
    """
    return (max(values) - min(values)) / statistics.median(values)


def jitter_spread(runs: list[list[float]], trials: int = 500, seed: int = 0, least: int = 5) -> float | None:
    """The spread the runs' medians would show if the runs differed only by their steps' jitter.

    Each run's step times are divided by that run's median (which removes whatever moved the run as a whole),
    pooled, and drawn again into as many runs of as many steps; the median spread of their medians over
    ``trials`` draws. A cell whose spread is near this is limited by step-to-step jitter (more steps cut it as
    one over the root of their count); a cell far above it had runs that moved as a whole. None without at
    least two runs, or with a run of fewer than ``least`` timed steps (dividing 3 steps by their own median
    leaves a third of them at exactly 1, which understates the jitter).

    >>> jitter_spread([[1.0] * 5, [2.0] * 5])   # steady steps: the runs' gap is not jitter
    0.0
    """
    runs = [r for r in runs if r]
    if len(runs) < 2 or min(len(r) for r in runs) < least:
        return None
    pool = [t / statistics.median(r) for r in runs for t in r]
    rng = random.Random(seed)
    draws = [spread([statistics.median(rng.choices(pool, k=len(r))) for r in runs]) for _ in range(trials)]
    return statistics.median(draws)
