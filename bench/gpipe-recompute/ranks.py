"""Per rank, the medians over steps of bench/plan-latency/where.py's lines in each log: the step's wall, the main
thread's CPU, and the waits on the pipeline's sends and receives (pp) and on the step's closing sums (meta).

    python bench/gpipe-recompute/ranks.py bench/gpipe-recompute/*.log"""
import json
import re
import statistics
import sys


def rows(log: str) -> list[dict]:
    text, dec, out = open(log).read(), json.JSONDecoder(), []
    for m in re.finditer(r"where (\{)", text):  # (the hosts' lines can interleave in the combined log)
        try:
            out.append(dec.raw_decode(text, m.start(1))[0])
        except ValueError:
            pass
    return out


def main(logs: list[str]) -> None:
    for log in logs:
        got = rows(log)
        print(f"{log.rsplit('/', 1)[-1]}: {len(got)} rank-steps")
        for k in sorted({r["rank"] for r in got}):
            mine = [r for r in got if r["rank"] == k]

            def med(f, mine=mine):
                return statistics.median(f(r) for r in mine) * 1e3
            print(f"  rank {k}: wall {med(lambda r: r['wall']):.1f} ms, main thread CPU "
                  f"{med(lambda r: r['thread_cpu']):.1f}, pp {med(lambda r: r['comm'].get('pp', 0.0)):.1f}, "
                  f"meta {med(lambda r: r['comm'].get('meta', 0.0)):.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
