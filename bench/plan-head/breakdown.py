"""The head's estimate of a saved cell's candidates taken apart, on the profile bench/plan-head/reprice.py cached for
it and the same topology it prices them on (the run's own, with the fitted link burst where
bench/plan-burst/fit.jsonl has the cell's): per candidate its step, compute, exposed communication and bubble, and
under FSDP each kind of call's seconds, each pipeline stage's compute a micro-batch, under tp each stage's calls a
micro-batch (and their wait after compute); then the profile's figures (each chain layer's seconds and recompute
share at ``--samples``, the step factor, the cost per micro-batch). Plans given with ``--plan FILE`` are priced
beside them.

    python bench/plan-head/breakdown.py plan-head-lstm-8h lstm_lm --plan bench/fsdp-quarter/dp8-pp1-tp1-m1.json \\
        > bench/fsdp-quarter/priced.txt
    python bench/plan-head/breakdown.py plan-head5-5h-150 classifier --samples 16 > bench/gpipe-recompute/priced.txt"""
import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
for sub in ("", "plan-probe-groups", "plan-wait", "plan-burst"):
    sys.path.insert(0, str(BENCH / sub))
from held import topology  # noqa: E402
from reprice_common import measured_rows, plan_of  # noqa: E402
from reprice_probed import probed_ways, setup  # noqa: E402

import tessel.planner.estimate as est  # noqa: E402
from tessel.bench import plan_check as pc  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402
from tessel.resolve import job_of, settings_of  # noqa: E402

PARTS: list[str] = []


def _sharded_parts(plan, params, units, gathered, elem, topo, stride):
    """The estimate's FSDP pricing, with its calls' seconds noted for the printout."""
    out, gather, seconds = SHARDED(plan, params, units, gathered, elem, topo, stride)
    s, r = plan.dp_shard, plan.dp_replicate
    rep = (topo.call_seconds(out["dp.replicate"], units, units * 2 * (r - 1), topo.group_rate(r, stride * s))
           if r > 1 else 0.0)
    PARTS.append(f"gathers {gather * plan.micro_batches * 1e3:.1f} ms a step, reduce-scatters "
                 f"{(seconds - rep) * 1e3:.1f}, replicas' sums {rep * 1e3:.1f}")
    return out, gather, seconds


def _tp_parts(plan, profile, layers, rows, topo, wire, cpu):
    """The estimate's tensor-parallel calls of one micro-batch on a stage, with their seconds noted for the printout:
    all of it, and the part that is the wait after compute (Topology.wait)."""
    out = TP(plan, profile, layers, rows, topo, wire, cpu)
    if plan.tp > 1:
        bare = TP(plan, profile, layers, rows, replace(topo, wait_points=()), wire, cpu)[2]
        TP_PARTS.append(f"layers {layers.start}-{layers.stop - 1} {out[2] * 1e3:.1f} ms "
                        f"(wait {(out[2] - bare) * 1e3:.1f})")
    return out


SHARDED, est._sharded_sync = est._sharded_sync, _sharded_parts
TP, est._tp_traffic = est._tp_traffic, _tp_parts


def _stages(plan, compute, *rest):
    """The estimate's pipeline span, with each stage's compute a micro-batch noted for the printout."""
    STAGES[:] = [f"{c * 1e3:.1f}" for c in compute]
    return PIPELINE(plan, compute, *rest)


PIPELINE, est.pipeline = est.pipeline, _stages
STAGES: list[str] = []
TP_PARTS: list[str] = []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("model")
    ap.add_argument("--plan", action="append", default=[])
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--profiles", default="/tmp/pg-head5.pkl")
    args = ap.parse_args()
    sys.argv = [sys.argv[0], str(BENCH / args.folder), "--profiles", args.profiles]
    _, points, _, profiles = setup()
    fit = {(d["hosts"], d["rate"]): d["link_burst"]
           for d in map(json.loads, (BENCH / "plan-burst" / "fit.jsonl").read_text().splitlines())}
    cfg = load_config(None, [*pc.MODELS[args.model], *pc.COMMON])
    settings = settings_of(cfg)
    rows = [r for r in measured_rows(BENCH / args.folder) if r["model"] == args.model]
    r = rows[0]
    topo = replace(probed_ways(r, topology(r, None), points)[-1],
                   link_burst=fit.get((r["hosts"], r["rate"]), (r.get("probe") or {}).get("link_burst", 0.0)))
    profile = profiles[f"{args.folder}/{args.model}/{r['hosts']}"]
    profile.job = job_of(cfg)  # (the cache drops it; tp's shares are measured on the built model)
    plans = [(row["plan"], plan_of(BENCH / args.folder, row, cfg), row["measured"]) for row in rows]
    plans += [(f, ParallelPlan.from_json(Path(f).read_text()), None) for f in args.plan]
    print(f"{args.folder}, {args.model}, {r['hosts']} hosts, {r['rate']}: speed {topo.speed:.3f}, "
          f"FSDP's rates {topo.fsdp_points}")
    for name, plan, measured in plans:
        PARTS.clear()
        TP_PARTS.clear()
        e = est.estimate(plan, settings, profile, topo)
        got = f", measured {measured * 1e3:.1f}" if measured else ""
        print(f"{name}: step {e.step * 1e3:.1f} ms (compute {e.compute * 1e3:.1f}, comm {e.comm * 1e3:.1f}, bubble "
              f"{e.bubble * 1e3:.1f}){got}" + (f"; {PARTS[-1]}" if PARTS else "")
              + (f"; stages' compute a micro-batch {' / '.join(STAGES)} ms" if len(STAGES) > 1 else "")
              + (f"; tp calls a micro-batch, per stage: {', '.join(TP_PARTS)}" if TP_PARTS else ""))
    if args.samples:
        n = args.samples
        print(f"profile: step factor {profile.step_factor:.3f}, per_micro {profile.per_micro * 1e3:.2f} ms; at {n} "
              "samples, each layer's seconds and recompute share: " + ", ".join(
                  f"{layer.name} {layer.seconds(n) * 1e3:.3f} ms ({layer.again_at('layers', n) or 0:.3f})"
                  for layer in profile.layers))


if __name__ == "__main__":
    main()
