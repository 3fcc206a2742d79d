"""Checks run once in the launching process, so bad input fails in a second, not after N workers start.

Everything here is also checked (or would fail) inside the workers; doing it first turns a crash
of every worker into one line and exit code 2.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from .config import Config
from .errors import ConfigError
from .parallelize import check_model
from .plan import ParallelPlan, saved_plan
from .train import checkpoint
from .train.build import build, build_data, model_identity
from .train.resume import find_start


def _check_machine(cfg: Config) -> None:
    """What the config cannot know alone: the backend this torch build has, an output folder it may write, the
    link rate the emulated cluster passes in the environment."""
    if cfg.parallel.backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise ConfigError("parallel.backend 'nccl' needs CUDA GPUs and a CUDA build of torch; this one has none; "
                          "valid here: auto, gloo")
    _check_writable(Path(cfg.metrics.out), "metrics.out")
    rate = os.environ.get("TESSEL_LINK_MBIT")
    if rate:
        try:
            ok = math.isfinite(float(rate)) and float(rate) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"TESSEL_LINK_MBIT is '{rate}'; it must be a positive number of Mbit/s, e.g. 200, "
                              "or unset (the rate is then measured)")


def _check_writable(folder: Path, key: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ConfigError(f"{key} '{folder}' cannot be written ({e.strerror or type(e).__name__}); "
                          "give a folder you may create files in") from None


def preflight(cfg: Config, world_size: int | None = None) -> ParallelPlan:
    """Validate the plan (degrees, batch, schedule, axes), the model's arguments and shapes, data files and
    the checkpoint to start or resume from; returns the plan."""
    plan = ParallelPlan.from_config(cfg, world_size or cfg.nproc).check(cfg)
    _check_machine(cfg)
    try:
        dataset = build_data(cfg)  # tokenizes and caches text files once, before the workers read them
        vocab = getattr(dataset, "vocab_size", 0)
        with torch.device("meta"):  # checks the model's arguments without allocating its weights
            model = build(cfg, vocab)
    except MemoryError as e:  # numpy's is one too
        raise ConfigError(f"model '{cfg.model.name}' with these sizes needs more memory than this machine has "
                          f"({str(e).splitlines()[0][:120]}); make model.* or data.* smaller") from None
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
