"""The candidates two saved `tessel bench plan` runs of one cell share: each one's measured step (the median of its
rounds) in the earlier run and in the later, and their ratio, and the same for the compute its run's planner priced
it at (from that run's profile of the model on this machine); then the median ratios per model. Whether an earlier
run's measurements still stand for today's machine. Only candidates whose plans are the same (the same stage cut)
are paired; the others are named and left out.

    python bench/plan-head/stale.py bench/plan-unseen-2h-100 bench/plan-head-2h-100 > bench/plan-head/stale-2h-100.txt
    (and likewise plan-unseen-3h, plan-unseen, plan-unseen-5h-150 and -cls, plan-lstm-8h against its two re-runs)
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common

from reprice_common import measured_rows  # noqa: E402

from tessel.plan import ParallelPlan  # noqa: E402


def plan_file(folder: Path, r: dict) -> ParallelPlan:
    """The plan the run trained ``r`` with (fields its file predates at their defaults)."""
    return ParallelPlan.from_json((folder / "plans" / f"{r['model']}-h{r['hosts']}-{r['rate']}" /
                                   f"{r['plan'].replace(' ', '-')}.json").read_text())


before, after = (Path(a) for a in sys.argv[1:3])
rows = {(r["model"], r["hosts"], r["rate"], r["plan"]): r for r in measured_rows(before)}
ratios: dict[str, list[tuple[float, float]]] = {}
for r in measured_rows(after):
    old = rows.get((r["model"], r["hosts"], r["rate"], r["plan"]))
    if old and plan_file(before, old) != plan_file(after, r):
        print(f"{r['model']} {r['plan']}: left out, its stage cut differs between the runs")
    elif old:
        ratios.setdefault(r["model"], []).append((r["measured"] / old["measured"], r["compute"] / old["compute"]))
        print(f"{r['model']} {r['plan']}: measured {old['measured'] * 1e3:.0f} ms in {before.name}, "
              f"{r['measured'] * 1e3:.0f} ms in {after.name}, {r['measured'] / old['measured']:.2f}x; compute priced "
              f"{old['compute'] * 1e3:.0f} -> {r['compute'] * 1e3:.0f} ms, {r['compute'] / old['compute']:.2f}x")
for model, rs in ratios.items():
    m, c = [x for x, _ in rs], [y for _, y in rs]
    print(f"{model}: {len(rs)} shared candidates, later over earlier: measured median {statistics.median(m):.2f}x "
          f"({min(m):.2f}-{max(m):.2f}), compute priced median {statistics.median(c):.2f}x ({min(c):.2f}-{max(c):.2f})")
