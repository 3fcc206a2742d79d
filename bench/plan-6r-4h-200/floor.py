"""How well one 3-round median predicts another: the measurement floor of the planner's goals on this machine.

A cell run with 6 rounds in alternating order splits into two halves of 3 rounds each (even rounds, odd rounds: each
half spans the whole invocation, so the machine's drift falls in both). The median of one half is a "perfect
predictor" of the same candidates, judged as the planner is judged: against the other half's median, by the median
and worst absolute error and Spearman over the cell's candidates. If that predictor misses a goal, the goal cannot be
judged at 3 rounds on this machine. The planner's own errors are given beside it, against all 6 rounds' median.

    python floor.py bench/plan-6r-4h-200/results.json
"""
import json
import statistics
import sys

from tessel.bench.plan_check import _cells, _pick, _rounds, _spearman


def judge(pred: list[float], meas: list[float]) -> tuple[float, float, float]:
    errs = [(p - m) / m for p, m in zip(pred, meas)]
    worst = max(errs, key=abs)
    return statistics.median(abs(e) for e in errs), worst, _spearman(pred, meas)


def fmt(t) -> str:
    return f"median {t[0]:.0%}, worst {t[1]:+.0%}, Spearman {t[2]:.2f}"


rows = json.load(open(sys.argv[1]))["rows"]
for name, rs in _cells(rows):
    rs = [r for r in rs if r["measured"] and len(_rounds(r)) >= 6]
    halves = [[statistics.median(v for k, v in _rounds(r).items() if k % 2 == h) for r in rs] for h in (0, 1)]
    every = [statistics.median(_rounds(r).values()) for r in rs]
    planner = [r["predicted"] for r in rs]
    ratio, verdict = _pick(rs)
    print(f"{name} ({len(rs)} candidates, 6 rounds)")
    print(f"  even rounds' median as the prediction of the odd rounds': {fmt(judge(halves[0], halves[1]))}")
    print(f"  odd rounds' median as the prediction of the even rounds': {fmt(judge(halves[1], halves[0]))}")
    print(f"  the planner (as run) against all 6 rounds' median:        {fmt(judge(planner, every))}")
    for h, label in ((0, "even"), (1, "odd")):
        print(f"  the planner against the {label} rounds' median:               {fmt(judge(planner, halves[h]))}")
    print(f"  the pick over the best measured, 6 rounds paired: {ratio}: {verdict}")
