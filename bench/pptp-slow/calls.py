"""Per rank, medians over a where.py log's steps: the wall of the tensor-parallel calls a micro-batch's forward and
backward make (every tp channel but the once-a-step ``tp.grads``), the time outside collectives and the main thread's
CPU; then the logged step's calls (where.py's WHERE_EACH line): calls on the ``tp`` channel, their median wall, the
median main-thread CPU since the rank's previous call returned (the compute before each), and the share of the wall
between calls the main thread was on a core.

    python bench/pptp-slow/calls.py bench/pptp-slow/where-*.log > bench/pptp-slow/calls.txt"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-latency"))
from loglines import tagged  # noqa: E402

for log in sys.argv[1:]:
    print(Path(log).name)
    rows = tagged(Path(log).read_text(), "where")
    for k in sorted({r["rank"] for r in rows}):
        mine = [r for r in rows if r["rank"] == k]

        def med(f, mine=mine):
            return statistics.median(map(f, mine)) * 1e3
        tp = med(lambda r: sum(v for c, v in r["comm"].items() if c.startswith("tp") and c != "tp.grads"))
        print(f"  rank {k}: a step {med(lambda r: r['wall']):.1f} ms, tp calls {tp:.1f}, outside collectives "
              f"{med(lambda r: r['wall'] - sum(r['comm'].values())):.1f}, main thread CPU "
              f"{med(lambda r: r['thread_cpu']):.1f}")
    for r in sorted(tagged(Path(log).read_text(), "each"), key=lambda r: r["rank"]):
        tp = [(wall, gap, cpu) for channel, wall, gap, cpu, *_ in r["calls"] if channel == "tp"]
        if not tp:
            continue
        walls, gaps, cpus = zip(*tp)
        short = [(g, c) for g, c in zip(gaps, cpus) if g < 0.05]  # (a gap of 50 ms or more waited on another stage)
        print(f"  rank {r['rank']}: {len(tp)} tp calls, median wall {statistics.median(walls) * 1e3:.1f} ms "
              f"(range {min(walls) * 1e3:.1f}-{max(walls) * 1e3:.1f}), compute before each "
              f"{statistics.median(cpus) * 1e3:.1f} ms of CPU; between calls the main thread ran "
              f"{sum(c for _, c in short) / sum(g for g, _ in short):.2f} of a core")
