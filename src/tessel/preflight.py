"""Checks run once in the launching process, so bad input fails in a second, not after N workers start.

Everything here is also checked (or would fail) inside the workers; doing it first turns a crash
of every worker into one line and exit code 2.
"""

from __future__ import annotations

import torch

from .config import Config
from .parallelize import check_model
from .plan import ParallelPlan, saved_plan
from .train import checkpoint
from .train.build import build, build_data, model_identity
from .train.resume import find_start


def preflight(cfg: Config, world_size: int | None = None) -> ParallelPlan:
    """Validate the plan (degrees, batch, schedule, axes), the model's arguments and shapes, data files and
    the checkpoint to start or resume from; returns the plan."""
    plan = ParallelPlan.from_config(cfg, world_size or cfg.nproc).check(cfg)
    dataset = build_data(cfg)  # tokenizes and caches text files once, before the workers read them
    vocab = getattr(dataset, "vocab_size", 0)
    with torch.device("meta"):  # checks the model's arguments without allocating its weights
        model = build(cfg, vocab)
    check_model(model, plan, cfg)
    identity = model_identity(cfg, vocab)
    if cfg.checkpoint.init_from:
        path = checkpoint.latest(cfg.checkpoint.init_from) or cfg.checkpoint.init_from
        checkpoint.inspect(path, identity, weights_only=True)
    if cfg.checkpoint.resume:  # the newest intact checkpoint (damaged ones are skipped, and said so, in rank 0)
        start = find_start(cfg.checkpoint_dir, resume=True, restarted=False)
        _, meta = checkpoint.inspect(start.path, identity, verify=False)
        saved_plan(meta, plan, start.path)
    return plan
