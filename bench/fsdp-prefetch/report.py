"""bench/fsdp-prefetch's logs: per run the median step wall (steps 3 on, each rank's median, then the median over
ranks) and the busiest rank's dp.gather bytes and calls a step; the paired ratio torch / tessel over rounds.
    python bench/fsdp-prefetch/report.py bench/fsdp-prefetch/logs"""
import re
import statistics
import sys
from pathlib import Path

from tessel.bench.stats import interval

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-latency"))
from loglines import tagged as rows  # noqa: E402


def run(log: Path) -> dict:
    text = log.read_text()
    steps, sent = rows(text, "where"), rows(text, "bytes")
    ranks = sorted({r["rank"] for r in steps})
    wall = statistics.median(statistics.median(r["wall"] for r in steps if r["rank"] == k) for k in ranks)
    gather = max(r["sent"].get("dp.gather", 0) for r in sent[len(sent) // 2:])  # a settled step's, busiest rank
    calls = max(r["calls"].get("dp.gather", 0) for r in steps)
    return {"wall": wall, "gather": gather, "calls": calls}


runs = {}
for log in sorted(Path(sys.argv[1]).glob("round*-*.log")):
    r, p = re.match(r"round(\d+)-(\w+)\.log", log.name).groups()
    try:
        runs.setdefault(p, {})[int(r)] = run(log)
    except ValueError:
        print(f"{log.name}: no steps")
for p, by in sorted(runs.items()):
    walls = [v["wall"] for v in by.values()]
    print(f"{p}: {len(by)} runs; step wall median {statistics.median(walls) * 1e3:.1f} ms "
          f"({min(walls) * 1e3:.1f}-{max(walls) * 1e3:.1f}); dp.gather a step on the busiest rank "
          f"{sorted({v['gather'] for v in by.values()})} B in {sorted({v['calls'] for v in by.values()})} calls")
both = sorted(set(runs.get("torch", {})) & set(runs.get("tessel", {})))
ratio = interval([runs["torch"][r]["wall"] / runs["tessel"][r]["wall"] for r in both])
print(f"torch's default / tessel's lists, step wall, paired over {len(both)} rounds: {ratio.text()} "
      f"({ratio.verdict()})")
