"""What recomputing every layer adds to a step, measured: each plan below run with and without recompute in the same
invocation (3 rounds, alternating order, the plan check's settings and cluster: 4 hosts of half a core at
500 Mbit/s), and priced both ways by today's estimate (at the probe of bench/plan-fsdp-4h-500, the cell these plans
come from: its latencies, speed, rate, wait, quota and FSDP rates) on one profile, with the recompute share at the
global batch and at the micro-batch.

    python bench/plan-recompute/marginal.py bench/plan-recompute/marginal > bench/plan-recompute/marginal.txt
"""
import json
import statistics
import sys
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.bench.runner import run_scenario
from tessel.bench.scenarios import Scenario
from tessel.cluster.emulate import parse_rate
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import choose, topology
from tessel.planner.estimate import estimate
from tessel.planner.topology import Topology
from tessel.resolve import job_of, policy_of, settings_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reprice_sizes import at_global_batch  # noqa: E402

HOSTS, RATE, CPUS = 4, "500mbit", 0.5
PLANS = {  # model -> label -> plan (without recompute; each also runs with every layer recomputed)
    "lstm_lm": {"dp2-fsdp2-pp2-gpipe-m8": ParallelPlan(dp=2, dp_shard=2, pp=2, schedule="gpipe", micro_batches=8,
                                                       bounds=((0, 2), (2, 3))),
                "dp2-pp2-1f1b-m8": ParallelPlan(dp=2, pp=2, micro_batches=8, bounds=((0, 2), (2, 3)))},
}


def probe() -> dict:
    """The probe bench/plan-fsdp-4h-500 ran on these hosts before its candidates."""
    return json.loads((Path(__file__).resolve().parents[1] / "plan-fsdp-4h-500" / "results.json").read_text()
                      )["rows"][0]["probe"]


def main(out: Path):
    measured = probe()
    base = Topology(ranks=HOSTS, hosts=HOSTS, link_mbit=parse_rate(RATE) / 1e6, speed=CPUS)
    topo = topology.probed(base, measured, "bench/plan-fsdp-4h-500's probe")
    for model, plans in PLANS.items():
        cfg = load_config(None, [*pc.MODELS[model], *pc.COMMON])
        profile = choose(job_of(cfg), topo, False).profile
        flat = at_global_batch(profile)
        settings = settings_of(cfg)
        folder = out / "plans" / model
        folder.mkdir(parents=True, exist_ok=True)
        strategies, priced = {}, {}
        for label, plan in plans.items():
            for rc in ("none", "layers"):
                p = plan.with_(recompute=rc, sparse=policy_of(cfg))
                name = label + ("-recompute" if rc == "layers" else "")
                (folder / f"{name}.json").write_text(p.to_json())
                strategies[name] = ["--plan", str((folder / f"{name}.json").resolve())]
                priced[name] = (estimate(p, settings, flat, topo).step, estimate(p, settings, profile, topo).step)
        scn = Scenario(name="recompute", about="recompute's marginal cost", models={model: pc._flags(pc.MODELS[model])},
                       strategies=strategies, baseline=next(iter(strategies)), hosts=[HOSTS], rates=[RATE],
                       unshaped=False, common=pc._flags(pc.COMMON), cluster={"cpus": CPUS}, steps=8)
        records = run_scenario(scn, out / model, 3, prefix="tsrc")
        runs = {n: {r["repeat"]: r["step_time"] for r in records if r["strategy"] == n} for n in strategies}
        (out / f"{model}.json").write_text(json.dumps({"runs": runs, "priced": priced}, indent=1))
        for label in plans:
            with_, without = runs[label + "-recompute"], runs[label]
            diffs = [with_[k] - without[k] for k in sorted(set(with_) & set(without))]
            pw, pn = priced[label + "-recompute"], priced[label]
            print(f"{model} {label}: without {statistics.median(without.values()) * 1e3:.0f} ms, with "
                  f"{statistics.median(with_.values()) * 1e3:.0f} ms; recompute adds, paired by round: "
                  + ", ".join(f"{d * 1e3:.0f}" for d in diffs) + " ms (median "
                  f"{statistics.median(diffs) * 1e3:.0f}); priced at the global batch's share "
                  f"+{(pw[0] - pn[0]) * 1e3:.0f} ms ({pn[0] * 1e3:.0f} -> {pw[0] * 1e3:.0f}), at the micro-batch's "
                  f"+{(pw[1] - pn[1]) * 1e3:.0f} ms ({pn[1] * 1e3:.0f} -> {pw[1] * 1e3:.0f})", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
