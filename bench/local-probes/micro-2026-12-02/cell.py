"""One saved planner cell loaded for the scripts here: its config, rows, plans and one fresh profile."""
from pathlib import Path

from tessel.bench.plan_check import COMMON, MODELS, _saved
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner.profile import measure
from tessel.resolve import job_of


def load(folder: Path, model: str, hosts: int, rate: str):
    """(config, rows of the cell, plan name -> ParallelPlan, a fresh profile at every candidate's size and dp)."""
    cfg = load_config(None, [*MODELS[model], *COMMON])
    b = cfg.train.global_batch
    rows = [r for r in _saved(folder)[1] if r["model"] == model and r["hosts"] == hosts and r["rate"] == rate]
    plans = {r["plan"]: ParallelPlan.from_json((folder / "plans" / f"{model}-h{hosts}-{rate}" /
                                                f"{r['plan'].replace(' ', '-')}.json").read_text()) for r in rows}
    profile = measure(job_of(cfg), sizes=tuple(sorted({b // (p.dp * p.micro_batches) for p in plans.values()})),
                      dps=tuple(sorted({p.dp for p in plans.values()})))
    return cfg, rows, plans, profile
