"""Where a tensor-parallel step's wall goes on the emulated hosts: `tessel train` with tessel.comm's collectives
timed. Every blocking collective's wall and each asynchronous one's wait is added to its channel; each step (from
one tessel.comm.counter.end_step to the next) also gives its wall, the main thread's CPU and the process's CPU (gloo's
threads too). Each rank prints one line per step after the first two, as JSON; the medians over steps and ranks are
what docs/benchmarks.md quotes.

Run: tessel cluster run --hosts 8 --rate 1gbit --torchrun -- bench/plan-latency/where.py <tessel train's arguments>
     > where.log; then python bench/plan-latency/where.py report where.log (medians over steps, then over ranks),
     or python bench/plan-latency/where.py ranks LOG... (each rank's medians over steps, per log).
WHERE_PROBE_AT=N runs the planner's probe (tessel.planner.probe.measure) inside the job after step N: its ring step
measured in the same invocation as the job's own calls. WHERE_EACH=N prints step N's calls one by one: each call's
channel, its wall, and the wall and main-thread CPU since the rank's previous call returned (the compute before it),
and the host's TCP counters that moved over that step (its network namespace's /proc/net/snmp and netstat)."""
import json
import os
import statistics
import sys
import time

from loglines import tagged  # (this folder, on the path as the script's)


def steps(log: str) -> list[dict]:
    """Every rank's per-step line in a log, as printed below."""
    return tagged(open(log).read(), "where")


def report(log: str) -> None:
    rows = steps(log)
    ranks = sorted({r["rank"] for r in rows})

    def med(f):
        per = [statistics.median([f(r) for r in rows if r["rank"] == k]) for k in ranks]
        return f"{statistics.median(per) * 1e3:.1f} ms (ranks {min(per) * 1e3:.1f}-{max(per) * 1e3:.1f})"
    print(f"{len(rows) // len(ranks)} steps a rank, {len(ranks)} ranks; medians over steps, then ranks")
    for name, f in (("wall", lambda r: r["wall"]), ("main thread CPU", lambda r: r["thread_cpu"]),
                    ("process CPU", lambda r: r["process_cpu"]), ("in collectives", lambda r: sum(r["comm"].values()))):
        print(f"{name}: {med(f)}")
    for c in sorted({c for r in rows for c in r["comm"]}):
        n = sorted({r.get("calls", {}).get(c, 0) for r in rows})  # (logs before 2026-12-07 have no count)
        print(f"  {c}: {med(lambda r, c=c: r['comm'].get(c, 0.0))}" + (f", calls a step on a rank: {n}" if n != [0]
                                                                       else ""))


def ranks(logs: list[str]) -> None:
    """Per log, each rank's medians over steps: the step's wall, the main thread's CPU, and the waits on the
    pipeline's sends and receives (pp) and on the step's closing sums (meta)."""
    for log in logs:
        rows = steps(log)
        print(f"{log.rsplit('/', 1)[-1]}: {len(rows)} rank-steps")
        for k in sorted({r["rank"] for r in rows}):
            mine = [r for r in rows if r["rank"] == k]

            def med(f, mine=mine):
                return statistics.median(f(r) for r in mine) * 1e3
            print(f"  rank {k}: wall {med(lambda r: r['wall']):.1f} ms, main thread CPU "
                  f"{med(lambda r: r['thread_cpu']):.1f}, pp {med(lambda r: r['comm'].get('pp', 0.0)):.1f}, "
                  f"meta {med(lambda r: r['comm'].get('meta', 0.0)):.1f}")


if sys.argv[1:2] == ["report"]:
    report(sys.argv[2])
    sys.exit(0)
if sys.argv[1:2] == ["ranks"]:
    ranks(sys.argv[2:])
    sys.exit(0)

from tcpstat import tcp_counters  # noqa: E402  (this folder, on the path as the script's)

from tessel import comm  # noqa: E402
from tessel.cli import main  # noqa: E402

spent: dict[str, float] = {}
calls: dict[str, int] = {}


EACH = int(os.environ.get("WHERE_EACH", "0"))


tcp_at = [{}]
last = [time.perf_counter(), time.thread_time()]  # when and at what CPU the rank's previous call returned
each: list = []


def timed(what, channel, call, async_op, then=None):
    t0, c0 = time.perf_counter(), time.thread_time()
    gap = (t0 - last[0], c0 - last[1])
    calls[channel] = calls.get(channel, 0) + 1
    out = real_run(what, channel, call, async_op, then)
    spent[channel] = spent.get(channel, 0.0) + time.perf_counter() - t0
    if step[0] + 1 == EACH:
        each.append((channel, time.perf_counter() - t0, *gap))
    last[:] = [time.perf_counter(), time.thread_time()]
    if out is not None:  # an asynchronous call: its wait is the time it holds the step up
        wait = out.wait

        def waited():
            w0 = time.perf_counter()
            wait()
            spent[channel] = spent.get(channel, 0.0) + time.perf_counter() - w0
        out.wait = waited
    return out


real_run, comm._run = comm._run, timed
real_end = comm.counter.end_step
mark = [time.perf_counter(), time.thread_time(), time.process_time()]
step = [0]


PROBE_AT = int(os.environ.get("WHERE_PROBE_AT", "0"))  # run the planner's probe inside the job after this step


def end_step():
    now = [time.perf_counter(), time.thread_time(), time.process_time()]
    step[0] += 1
    if step[0] == PROBE_AT:  # (every rank ends each step, so all enter the probe's collectives together)
        from tessel.planner import probe
        print("probe " + json.dumps({"rank": int(os.environ.get("RANK", 0)), **probe.measure(),
                                     "threads": len(os.listdir("/proc/self/task"))}), flush=True)
        now = [time.perf_counter(), time.thread_time(), time.process_time()]
    if step[0] > 2:
        print("where " + json.dumps({"rank": int(os.environ.get("RANK", 0)), "step": step[0],
                                     "wall": now[0] - mark[0], "thread_cpu": now[1] - mark[1],
                                     "process_cpu": now[2] - mark[2], "comm": dict(spent),
                                     "calls": dict(calls)}), flush=True)
    if step[0] + 1 == EACH:
        tcp_at[0] = tcp_counters()
    if each:
        moved = {k: v - tcp_at[0].get(k, 0) for k, v in tcp_counters().items() if v != tcp_at[0].get(k, 0)}
        print("each " + json.dumps({"rank": int(os.environ.get("RANK", 0)), "calls": each, "tcp": moved}), flush=True)
        each.clear()
    mark[:] = now
    spent.clear()
    calls.clear()
    return real_end()


comm.counter.end_step = end_step
sys.exit(main(["train", *sys.argv[1:]]))
