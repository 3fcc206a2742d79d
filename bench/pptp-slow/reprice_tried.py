"""Three ways of pricing a tensor-parallel call for what bench/pptp-slow/README.md measured in the two pp x tp plans
priced slow, tried on the 47 cells of bench/plan-head/reprice.py and not kept. The estimate's source is rebuilt here
only, for this run; the package is not changed.

    python bench/pptp-slow/reprice_tried.py period 0.010 > bench/pptp-slow/reprice-period.txt
    python bench/pptp-slow/reprice_tried.py bucket 1 > bench/pptp-slow/reprice-bucket.txt
    python bench/pptp-slow/reprice_tried.py fill 1 > bench/pptp-slow/reprice-fill.txt

``period P``: each call's wait after compute (Topology.wait) scaled by 1 - T/P, T its bytes' time at the group's
rate, P the CFS period: a call whose bytes idle the CPU for a period leaves the next compute a fresh quota.
``bucket K``: each call spanning hosts sends K times min(link_burst, the compute before it at the host's speed x the
rate) fewer bytes at the rate: the shaped link's bucket refills while the rank computes.
``fill K``: a flushed pipeline's fill and drain (the first micro-batch's trip over the stages, each after it idled)
pay K times none of their tensor-parallel calls' wait after compute."""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-head"))
from rebuilt import rebuild, reprice  # noqa: E402

# (whole lines of the estimate's source, each rebuilt below; their indent inside _tally's loop or estimate's)
WAIT = (" " * 8 + "seconds += topo.wait(size, n, share * n)  # (before the split below: an all-gather follows its "
        "pair at once)\n")
CALL = (" " * 8 + "seconds += topo.call_seconds(e * width(channel), n, steps, "
        "topo.group_rate(size, stride * tp_stride),\n"
        + " " * 37 + "tiny=channel == \"tp.norm2\")  # (the squared norm: one fp64 element)\n")
TRAFFIC = "        e_tp, n_tp, s_tp = _tp_traffic(plan, profile, range(lo, hi), rows, topo, wire, cpu)\n"
WAYS = {
    "period": [(WAIT, "        each = e * width(channel) / max(n, 1) / topo.group_rate(size, stride * tp_stride)\n"
                      "        seconds += topo.wait(size, n, share * n) * max(0.0, 1 - each / K)\n")],
    "bucket": [(CALL, "        rate = topo.group_rate(size, stride * tp_stride)\n"
                      "        refill = K * min(topo.link_burst, share / topo.speed * rate) if topo.spans_hosts(\n"
                      "            size, stride * tp_stride) else 0.0\n"
                      "        sent = max(0.0, e * width(channel) - n * refill)\n"
                      "        seconds += topo.call_seconds(sent, n, steps, rate, tiny=channel == 'tp.norm2')\n")],
    "fill": [(TRAFFIC, TRAFFIC + "        bare = replace(topo, wait_points=())\n"
                                 "        waits.append(s_tp - _tp_traffic(plan, profile, range(lo, hi), rows, bare,\n"
                                 "                                        wire, cpu)[2])\n"),
             ("    runtime = _runtime(plan, profile, topo)\n",
              "    runtime = _runtime(plan, profile, topo)\n    waits = []\n"),
             ("    # a weight two stages hold (a tied one)",
              "    if plan.pp > 1 and plan.schedule.flushed and topo.quota:\n"
              "        bubble = max(0.0, bubble - K * sum(waits))\n    # a weight two stages hold (a tied one)")],
}


if __name__ == "__main__":
    rebuild(WAYS[sys.argv[1]], K=float(sys.argv[2]), replace=replace)
    reprice()
