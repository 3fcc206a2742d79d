"""Host 1's CFS throttling over each second of a run (bench/fsdp-quarter/throttle.sh's samples): the share of its
10 ms periods in which it ran out of quota, and the throttled milliseconds per second of wall; then over the run's
last ``--last`` seconds before the group went away (the training steps, given how long they took).

    python bench/fsdp-quarter/throttle.py bench/fsdp-quarter/throttle-dp8-fsdp4-pp1-tp1-m1.tsv --last 12"""
import sys


def main(path: str, last: float) -> None:
    rows = [[float(x) for x in line.split()[:4]] for line in open(path) if len(line.split()) >= 4]
    t_end = rows[-1][0]
    for a, b in zip(rows[::4], rows[4::4]):
        dt = b[0] - a[0]
        print(f"{a[0] - rows[0][0]:5.1f} s: {(b[2] - a[2]) / max(b[1] - a[1], 1):.0%} of periods throttled, "
              f"{(b[3] - a[3]) / 1e6 / dt:.0f} ms throttled a second")
    window = [r for r in rows if r[0] >= t_end - last]
    a, b = window[0], window[-1]
    print(f"last {b[0] - a[0]:.1f} s: {(b[2] - a[2]) / max(b[1] - a[1], 1):.0%} of {b[1] - a[1]:.0f} periods "
          f"throttled, {(b[3] - a[3]) / 1e6 / (b[0] - a[0]):.0f} ms throttled a second")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[sys.argv.index("--last") + 1]) if "--last" in sys.argv else 10.0)
