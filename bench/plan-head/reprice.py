"""Every cell of docs/benchmarks.md's "Where every cell stands" (each model, host count and rate's latest run of 3
rounds per candidate) priced two ways: as run (the prediction its code made then, saved in its folder) and by this
commit's estimate, on one profile per (folder, model, hosts). The topology is the run's own (its speed, rate and
overlap); what its probe did not measure then is the probe's since: the held mesh's latencies, the wait, the quota
and FSDP's rates from bench/plan-wait/probes.jsonl, the link's burst from bench/plan-burst/probes.jsonl (the rules
of bench/plan-fsdp-wait/reprice.py). Per cell: both ways' scores, and each candidate the estimate prices more than
30% off.

    python bench/plan-head/reprice.py --profiles /tmp/pg-head.pkl > bench/plan-head/reprice.txt

With ``--earlier``, the cells as they stood before this session re-ran five of them (``EARLIER``: the runs from
before commit 0928663, whose pipelines ran 1.2-2x slower than today's, bench/plan-head/stale-*.txt):

    python bench/plan-head/reprice.py --profiles /tmp/pg-head.pkl --earlier > bench/plan-head/reprice-earlier.txt

With ``--fsdp FILE`` (JSON lines of hosts, rate and ``fsdp``, as bench/fsdp-rate/rates.sh writes them), FSDP's rates
at each host count and rate are those, in place of the run's own probe's:

    python bench/plan-head/reprice.py --profiles /tmp/pg-head.pkl --fsdp bench/fsdp-rate/rates.jsonl

With ``--burst FILE`` (JSON lines of hosts, rate and ``link_burst``, as bench/plan-burst/fit.sh writes them), the
link's burst likewise:

    python bench/plan-head/reprice.py --profiles /tmp/pg-head5.pkl --burst bench/plan-burst/fit.jsonl --head6 \
        > bench/plan-head/reprice-head6.txt   (--head6: the cells as they stood before the plan-head7 runs)
    python bench/plan-head/reprice.py --profiles /tmp/pg-head7.pkl --burst bench/plan-burst/fit.jsonl \
        > bench/plan-head/reprice-head7.txt
"""
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
for sub in ("", "plan-probe-groups", "plan-wait", "plan-burst"):
    sys.path.insert(0, str(BENCH / sub))
from held import price, report, save_profiles, summary  # noqa: E402
from reprice_burst import bursts  # noqa: E402
from reprice_probed import probed_ways, setup  # noqa: E402

# (the four cells the issue names, 4 and 8 hosts at 1 Gbit/s and 200 Mbit/s, run again at the head on 2026-12-08:
# plan-head7-*, in place of plan-tail-4h-1g, plan-mesh-4h-200, plan-mesh-8h-1g and plan-mesh-8h-200)
HEAD7 = {"plan-tail-4h-1g": "plan-head7-4h-1g", "plan-mesh-4h-200": "plan-head7-4h-200",
         "plan-mesh-8h-1g": "plan-head7-8h-1g", "plan-mesh-8h-200": "plan-head7-8h-200"}
FOLDERS = ("plan-head7-4h-1g", "plan-head7-4h-200", "plan-head-6h-500", "plan-head7-8h-1g", "plan-head-lstm-8h",
           "plan-head-lstm-8h-200", "plan-fsdp-order-2h-100", "plan-fsdp-order-6h-200", "plan-trip-2h-100",
           "plan-head5-6h-1g", "plan-head5-5h-150", "plan-unseen6-5h-600", "plan-unseen6-3h-1g",
           "plan-head7-8h-200", "plan-head-3h-300", "plan-head-2h-100", "plan-head-5h-150",
           "plan-mesh-6h-1g", "plan-wait-8h-500", "plan-wait-6h-400", "plan-fsdp-4h-500", "plan-micro-4h-300",
           "plan-burst-6h-300", "plan-fsdp-8h-300")
EARLIER = ("plan-tail-4h-1g", "plan-mesh-4h-200", "plan-unseen", "plan-mesh-8h-1g", "plan-lstm-8h", "plan-mesh-8h-200",
           "plan-unseen-3h", "plan-tail-6h-200", "plan-unseen-2h-100", "plan-unseen-5h-150", "plan-unseen-5h-150-cls",
           "plan-mesh-6h-1g", "plan-wait-8h-500", "plan-wait-6h-400", "plan-fsdp-4h-500", "plan-micro-4h-300",
           "plan-burst-6h-300", "plan-fsdp-8h-300")
# (folder, model) cells a later folder above ran again, left out unless ``--earlier``: on 2 hosts at 100 Mbit/s the LSTM
# run again with FSDP's rates probed in FSDP's order (plan-fsdp-order-2h-100), then the classifier and the Transformer
# with a one-micro-batch step priced as one trip and the link's burst fitted as well (plan-trip-2h-100);
# plan-tail-6h-200 is left out of FOLDERS whole, for plan-fsdp-order-6h-200
SUPERSEDED = {("plan-head-2h-100", "classifier"), ("plan-head-2h-100", "lstm_lm"),
              ("plan-head-2h-100", "transformer_lm"), ("plan-fsdp-order-2h-100", "classifier"),
              ("plan-mesh-6h-1g", "transformer_lm"),  # (the Transformer on 6 hosts at 1 Gbit/s: plan-head5-6h-1g)
              ("plan-head-5h-150", "classifier")}  # (plan-head5-5h-150)
# (with the plan-head7 cells, the LSTM on 8 hosts at 200 Mbit/s is plan-head7-8h-200's; plan-head7-8h-1g ran no LSTM)
SUPERSEDED_HEAD7 = {("plan-head-lstm-8h-200", "lstm_lm")}
WAYS = ("as run", "at the head")


def _given(flag: str) -> dict:
    """{(hosts, rate): line} of the JSON-lines file after ``flag`` on the command line (taken off it; the last line
    of a cell wins), or {} without the flag."""
    if flag not in sys.argv:
        return {}
    at = sys.argv.index(flag)
    lines = [json.loads(line) for line in Path(sys.argv[at + 1]).read_text().splitlines()]
    del sys.argv[at:at + 2]
    return {(d["hosts"], d["rate"]): d for d in lines}


def main():
    earlier, head6 = "--earlier" in sys.argv, "--head6" in sys.argv  # (--head6: the cells before plan-head7)
    sys.argv = [a for a in sys.argv if a not in ("--earlier", "--head6")]
    folders = EARLIER if earlier else tuple({v: k for k, v in HEAD7.items()}.get(f, f) for f in FOLDERS) if head6 \
        else FOLDERS
    superseded = SUPERSEDED if head6 else SUPERSEDED | SUPERSEDED_HEAD7
    fsdp = {k: tuple((int(g), a, b) for g, a, b in d["fsdp"]) for k, d in _given("--fsdp").items()}
    fitted = {k: d["link_burst"] for k, d in _given("--burst").items()}
    sys.argv[1:1] = [str(BENCH / f) for f in folders]
    args, points, latencies, profiles = setup()
    burst = bursts()
    met, ncells, errs = {w: [0] * 5 for w in WAYS}, 0, {w: [] for w in WAYS}

    def today(r, topo):
        probed = probed_ways(r, topo, points)
        own = fitted.get((r["hosts"], r["rate"]), (r.get("probe") or {}).get("link_burst", burst.get((r["hosts"],
                                                                                                  r["rate"]))))
        if not probed or own is None:
            return None
        rates = fsdp.get((r["hosts"], r["rate"]), probed[-1].fsdp_points)
        return [replace(probed[-1], link_burst=own, fsdp_points=rates)]
    for name in args.folders:
        cells = {k: [(r, [r["predicted"], got[0]]) for r, got in rows]
                 for k, rows in price(Path(name), profiles, today, latencies).items()}
        for cell, rows in cells.items():
            if not earlier and (Path(name).name, cell[0]) in superseded:
                continue
            ncells += report(Path(name).name, {cell: rows}, WAYS, met)
            for k, way in enumerate(WAYS):
                errs[way] += [(got[k] - r["measured"]) / r["measured"] for r, got in rows]
            far = [f"{r['plan']} {(got[1] - r['measured']) / r['measured']:+.0%}" for r, got in rows
                   if abs(got[1] - r["measured"]) > 0.3 * r["measured"]]
            print(f"  beyond 30% at the head: {', '.join(far) or 'none'}")
    for way, n in met.items():
        print(summary(way, n, ncells))
    for way, e in errs.items():
        print(f"{way}: {len(e)} candidates, median absolute error {statistics.median(map(abs, e)):.1%}, median "
              f"signed {statistics.median(e):+.1%}, within 30% {sum(abs(x) <= 0.3 for x in e)}")
    save_profiles(Path(args.profiles), profiles)


if __name__ == "__main__":
    main()
