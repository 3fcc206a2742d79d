"""Two ways of pricing FSDP's extra time on fractional-core hosts, tried on the 42 cells of bench/plan-head/reprice.py
and not kept (bench/fsdp-quarter/README.md). The estimate's ``_sharded_sync`` is wrapped or rebuilt here only, for
this run; the package is not changed.

    python bench/fsdp-quarter/reprice_tried.py cpu 1e-9 > bench/fsdp-quarter/reprice-cpu-1e-9.txt
    python bench/fsdp-quarter/reprice_tried.py wait 0.3 > bench/fsdp-quarter/reprice-wait-0.3.txt

``cpu K``: every byte FSDP moves costs K seconds of a core's CPU beside its link time, over the host's speed (each
micro-batch's gathers in its slot, the reduce-scatter and the replicas' sum once a step). ``wait S``: on hosts
slower than S of a core, each FSDP call is charged the probe's wait after compute (Topology.wait) with a third of
its unit's compute before it, as commit fba20b7 stopped doing for every host."""
import sys
from pathlib import Path

import tessel.planner.estimate as est

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-head"))
from rebuilt import rebuild, reprice  # noqa: E402


def per_byte(k: float) -> None:
    plain = est._sharded_sync

    def priced(plan, params, units, gathered, elem, topo, stride):
        out, gather, seconds = plain(plan, params, units, gathered, elem, topo, stride)
        gather += k * out["dp.gather"] / plan.micro_batches / topo.speed
        seconds += k * (out["dp.scatter"] + out.get("dp.replicate", 0.0)) / topo.speed
        return out, gather, seconds
    est._sharded_sync = priced


def waits_below(speed: float) -> None:
    swaps = [("else profile.elem, reduced, topo, dp_stride) for p, n in zip(dense, passes)]",
              "else profile.elem, reduced, topo, dp_stride, c * topo.speed) for p, n, c in zip(dense, passes, "
              "stage_compute)]"),
             ("                  stride: int) -> tuple[dict[str, float], float, float]:",
              "                  stride: int, cpu: float = 0.0) -> tuple[dict[str, float], float, float]:"),
             ('    seconds = topo.call_seconds(out["dp.scatter"], units, units * (s - 1), topo.fsdp_rate(s, stride, '
              '"scatter"))\n',
              '    seconds = topo.call_seconds(out["dp.scatter"], units, units * (s - 1), topo.fsdp_rate(s, stride, '
              '"scatter"))\n    each = cpu / (3 * units) if units else 0.0\n    if topo.speed < BELOW:\n'
              '        gather += topo.wait(s, 2 * units, 2 * units * each)\n'
              '        seconds += topo.wait(s, units, units * each)\n')]
    rebuild(swaps, BELOW=speed)


if __name__ == "__main__":
    way, value = sys.argv[1], float(sys.argv[2])
    {"cpu": per_byte, "wait": waits_below}[way](value)
    reprice()
