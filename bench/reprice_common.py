"""What the planner's re-pricing scripts share (bench/plan-wait, bench/plan-sync, bench/plan-latency): a saved cell's
rows, a saved candidate's plan, and one cell's score as `tessel bench plan` judges it. Only names every revision
those scripts run under has (tessel.bench.plan_check's _pick and _spearman), so each still runs on the commit its
docstring names. A script imports it with its own folder's parent on sys.path."""
import json
import statistics
from pathlib import Path

from tessel.bench import plan_check as pc
from tessel.plan import ParallelPlan
from tessel.resolve import policy_of


def measured_rows(folder: Path) -> list[dict]:
    """The candidates of a saved `tessel bench plan` run that ran."""
    return [r for r in json.loads((folder / "results.json").read_text())["rows"] if r.get("measured")]


def plan_of(folder: Path, r: dict, cfg) -> ParallelPlan:
    """The plan file the run trained ``r`` with, under the config's table policy."""
    path = folder / "plans" / f"{r['model']}-h{r['hosts']}-{r['rate']}" / f"{r['plan'].replace(' ', '-')}.json"
    return ParallelPlan.from_json(path.read_text()).with_(sparse=policy_of(cfg))


def score(rs: list[dict]) -> str:
    """One cell: median and worst error, Spearman, and the pick (the cheapest-priced candidate) by its paired
    interval over the best measured."""
    errs = [(r["predicted"] - r["measured"]) / r["measured"] for r in rs]
    ratio, verdict = pc._pick(rs)
    pick = min(rs, key=lambda r: r["predicted"])["plan"]
    said = f"{ratio.value:.2f}x ({ratio.low:.2f}-{ratio.high:.2f}) {verdict}" if ratio and ratio.n > 1 else verdict
    return (f"{statistics.median(abs(e) for e in errs):.0%}, {max(errs, key=abs):+.0%}, "
            f"{pc._spearman([r['predicted'] for r in rs], [r['measured'] for r in rs]):.2f}, pick {pick}: {said}")


def built(name: str):
    """(job, model, chain, inputs, targets) of `tessel bench plan`'s model ``name``: built at seed 0, its global
    batch, one thread (as the profile times it)."""
    import torch

    from tessel.chain import chain_of
    from tessel.config import load_config
    from tessel.resolve import job_of

    torch.set_num_threads(1)
    job = job_of(load_config(None, pc.MODELS[name] + pc.COMMON))
    torch.manual_seed(0)
    model = job.build()
    x, y = job.batch(job.settings.global_batch, 1)
    return job, model, chain_of(model), x, y
