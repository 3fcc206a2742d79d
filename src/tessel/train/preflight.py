"""Checks run once in the launching process, so bad input fails in a second, not after N workers start.

Everything here is also checked (or would fail) inside the workers; doing it first turns a crash
of every worker into one line and exit code 2.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint import FileSystemReader

from ..config import Config
from ..errors import CheckpointError
from ..mesh import ParallelDims
from ..tensor import check_config as check_tensor
from ..tensor import check_shapes
from . import checkpoint
from .loop import build, build_data, model_identity


def preflight(cfg: Config, world_size: int | None = None) -> ParallelDims:
    """Validate degrees, batch, model arguments, data files and the checkpoint to resume from."""
    world = world_size or cfg.nproc
    dims = ParallelDims.resolve(world, cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp)
    dims.check_batch(cfg.train.global_batch, cfg.train.micro_batches)
    spec = check_tensor(cfg, dims.tp)
    dataset = build_data(cfg)  # tokenizes and caches text files once, before the workers read them
    with torch.device("meta"):  # checks the model's arguments without allocating its weights
        model = build(cfg, getattr(dataset, "vocab_size", 0))
    if dims.pp > 1:
        from ..pipeline import check_config

        check_config(model, cfg, dims)
    if dims.tp > 1:
        check_shapes(model, spec, cfg.train.global_batch // (dims.dp * cfg.train.micro_batches))
    if cfg.checkpoint.init_from:
        path = checkpoint.latest(cfg.checkpoint.init_from) or cfg.checkpoint.init_from
        checkpoint.check_compatible(path, checkpoint.read_meta(path),
                                    model_identity(cfg, getattr(dataset, "vocab_size", 0)), weights_only=True)
    if cfg.checkpoint.resume:
        path = checkpoint.latest(cfg.checkpoint_dir)
        if path is None:
            raise CheckpointError(f"--resume: no complete checkpoint in '{cfg.checkpoint_dir}'; "
                                  "train without --resume first")
        meta = checkpoint.read_meta(path)
        checkpoint.check_compatible(path, meta, model_identity(cfg, getattr(dataset, "vocab_size", 0)))
        if meta.get("world_size") != world:
            raise CheckpointError(f"checkpoint '{path}' was saved by {meta.get('world_size')} ranks and holds "
                                  f"per-rank RNG and data state; resume it with {meta.get('world_size')} ranks, "
                                  f"not {world}")
        try:
            FileSystemReader(str(path)).read_metadata()
        except Exception as e:
            raise CheckpointError(f"checkpoint '{path}' is corrupt: its .metadata cannot be read "
                                  f"({type(e).__name__})") from None
    return dims
