"""Checks run once in the launching process, so bad input fails in a second, not after N workers start.

Everything here is also checked (or would fail) inside the workers; doing it first turns a crash
of every worker into one line and exit code 2.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint import FileSystemReader

from .config import Config
from .errors import CheckpointError
from .parallelize import check_model
from .plan import ParallelPlan, saved_plan
from .train import checkpoint
from .train.build import build, build_data, model_identity


def preflight(cfg: Config, world_size: int | None = None) -> ParallelPlan:
    """Validate the plan (degrees, batch, schedule, axes), the model's arguments and shapes, data files and
    the checkpoint to start or resume from; returns the plan."""
    plan = ParallelPlan.from_config(cfg, world_size or cfg.nproc).check(cfg)
    dataset = build_data(cfg)  # tokenizes and caches text files once, before the workers read them
    vocab = getattr(dataset, "vocab_size", 0)
    with torch.device("meta"):  # checks the model's arguments without allocating its weights
        model = build(cfg, vocab)
    check_model(model, plan, cfg)
    if cfg.checkpoint.init_from:
        path = checkpoint.latest(cfg.checkpoint.init_from) or cfg.checkpoint.init_from
        checkpoint.check_compatible(path, checkpoint.read_meta(path), model_identity(cfg, vocab), weights_only=True)
    if cfg.checkpoint.resume:
        path = checkpoint.latest(cfg.checkpoint_dir)
        if path is None:
            raise CheckpointError(f"--resume: no complete checkpoint in '{cfg.checkpoint_dir}'; "
                                  "train without --resume first")
        meta = checkpoint.read_meta(path)
        checkpoint.check_compatible(path, meta, model_identity(cfg, vocab))
        saved_plan(meta, plan, path)
        try:
            FileSystemReader(str(path)).read_metadata()
        except Exception as e:
            raise CheckpointError(f"checkpoint '{path}' is corrupt: its .metadata cannot be read "
                                  f"({type(e).__name__})") from None
    return plan
