"""Price the saved candidates of every planner cell (docs/benchmarks.md "Where every cell stands") twice on one
fresh profile per model and host count: with the recompute shares that profile measured (5 single-run rounds,
today's ``_recompute_shares``) and with shares measured right after it on the same model and batch the old way
(3 rounds of 3 runs, every call warmed: ``shares.before``). Everything else in the profile is shared, so the two
columns differ by the shares' estimator and its own noise alone. Only candidates with recompute move.

    python bench/plan-profile-cost/paired_shares.py > bench/plan-profile-cost/paired-shares.txt
"""

import json
import statistics
import sys
from pathlib import Path

import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).parent))
from shares import before  # noqa: E402

from tessel.bench.plan_check import COMMON, MODELS  # noqa: E402
from tessel.chain import chain_of  # noqa: E402
from tessel.cluster.emulate import parse_rate  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.plan import ParallelPlan  # noqa: E402
from tessel.planner import Topology  # noqa: E402
from tessel.planner.choose import choose  # noqa: E402
from tessel.planner.estimate import estimate  # noqa: E402
from tessel.resolve import job_of, policy_of, settings_of  # noqa: E402

BENCH = Path(__file__).resolve().parent.parent
# each cell's latest folder, as the table "Where every cell stands" reads them
FOLDERS = ["plan", "plan-lstm-again", "plan-unseen", "plan-8h", "plan-lstm-8h", "plan-tf-8h-200", "plan-cls-8h-200",
           "plan-unseen-3h", "plan-unseen-6h-200", "plan-unseen-2h-100", "plan-unseen-5h-150", "plan-unseen-5h-150-cls"]


def old_shares(cfg) -> list[dict]:
    """The shares the old way, on the model, chain and batch ``measure`` profiles (same seed and size)."""
    job = job_of(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(job.settings.seed)
            model = job.build()
            chain = chain_of(model)
            x, y = job.batch(job.settings.global_batch, 1)
            with job.settings.autocast():
                return before(model, chain, x, y)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    cells: dict = {}
    for folder in FOLDERS:
        for r in json.loads((BENCH / folder / "results.json").read_text())["rows"]:
            key = (r["model"], r["hosts"], r["rate"])
            if folder == "plan" and key == ("lstm_lm", 4, "1gbit"):
                continue  # its latest run is plan-lstm-again
            cells.setdefault(key, []).append((folder, r))
    profiles: dict = {}
    priced: dict = {}
    for (model, hosts, rate), rows in cells.items():
        cfg = load_config(None, [*MODELS[model], *COMMON])
        for folder, r in rows:
            topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                            speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"],
                            per_micro=r.get("per_micro", 0.0))
            if (model, hosts) not in profiles:  # profiled at every candidate's micro-batch size, as planning does
                profile = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
                profiles[model, hosts] = (profile, [layer.again for layer in profile.layers], old_shares(cfg))
            profile, new, old = profiles[model, hosts]
            name = f"{model}-h{hosts}-{rate}/{r['plan'].replace(' ', '-')}.json"
            plan = ParallelPlan.from_json((BENCH / folder / "plans" / name).read_text()).with_(sparse=policy_of(cfg))
            steps = []
            for shares in (old, new):
                for layer, share in zip(profile.layers, shares):
                    layer.again = share
                steps.append(estimate(plan, settings_of(cfg), profile, topo).step)
            priced.setdefault((model, hosts, rate), []).append((r, *steps))
    report(priced, profiles)


def report(priced: dict, profiles: dict) -> None:
    for (model, hosts), (_, new, old) in profiles.items():
        print(f"{model}, {hosts} hosts: layers' shares (layers, selective) old "
              + " ".join(f"{s.get('layers', 0):.2f}/{s.get('selective', 0):.2f}" for s in old) + "; new "
              + " ".join(f"{s.get('layers', 0):.2f}/{s.get('selective', 0):.2f}" for s in new))
    goals = {"old": [0, 0, 0, 0], "new": [0, 0, 0, 0]}
    moved = 0
    for (model, hosts, rate), got in priced.items():
        measured = [r["measured"] for r, *_ in got]
        line = f"{model}, {hosts} hosts, {rate}"
        for k, label in ((1, "old"), (2, "new")):
            errors = [abs(g[k] / g[0]["measured"] - 1) for g in got]
            rho = spearmanr([g[k] for g in got], measured).statistic
            pick = min(got, key=lambda g: g[k])[0]
            ratio = pick["measured"] / min(measured)
            met = [statistics.median(errors) <= 0.10, max(errors) <= 0.30, rho >= 0.8, ratio <= 1.10]
            goals[label] = [a + b for a, b in zip(goals[label], met)]
            line += (f" | {label}: {statistics.median(errors):.0%} / {max(errors):.0%} / {rho:.2f} / "
                     f"{ratio:.2f}x ({pick['plan']})")
        moved += sum(abs(g[1] - g[2]) > 1e-12 for g in got)
        print(line)
    cells = len(priced)
    for label, met in goals.items():
        print(f"{label} shares: cells meeting median <= 10%: {met[0]}, worst <= 30%: {met[1]}, Spearman >= 0.8: "
              f"{met[2]}, pick within 10% (the rounds' medians): {met[3]}, of {cells}")
    print(f"candidates whose price moved: {moved} of {sum(len(g) for g in priced.values())}")


if __name__ == "__main__":
    main()
