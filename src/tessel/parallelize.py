"""Apply parallelisms to a plain model from outside, in a fixed order: tp at build, pp split, dp wrap.

Data parallelism is torch DDP on the mesh's dp group, wrapped last; tensor parallelism
(:func:`tessel.tensor.parallelize`) and pipeline stages (:func:`tessel.pipeline.build`) are applied before it,
as torchtitan's ``parallelize_llama`` applies TP before FSDP.

Example::

    model = parallelize(model, dims, mesh)   # DDP over mesh["dp"], traffic counted on dp.dense
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from . import comm
from .mesh import ParallelDims


def replicate_from_first(module: torch.nn.Module, group) -> None:
    """Make every rank of ``group`` hold the first rank's parameters and buffers (counted on dp.init)."""
    import torch.distributed as dist

    src = dist.get_process_group_ranks(group)[0]
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            comm.broadcast(t.data, src, "dp.init", group=group)


TORCH_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb


def auto_bucket_mb(model: torch.nn.Module, buckets: int = 8) -> float:
    """A bucket size that cuts the model's gradients into about ``buckets`` all-reduces.

    DDP's 25 MB default puts a model of a few tens of MB into one or two buckets, and a bucket is only sent
    when its last gradient exists, so nearly all traffic waits for the end of the backward pass. Smaller
    buckets start sending while the backward pass goes on; below ~1 MB per-collective latency dominates.

    >>> auto_bucket_mb(torch.nn.Linear(1024, 4096))  # 16 MiB of fp32 weights
    2.0
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    return float(min(TORCH_BUCKET_MB, max(1.0, round(total / buckets))))


def apply_ddp(model: torch.nn.Module, dp_group, bucket_mb: float = 0.0, ddp_comm: str = "tessel") -> DDP:
    """Wrap ``model`` in DDP whose every byte (init and gradients) goes through tessel.comm.

    ``bucket_mb=0`` picks :func:`auto_bucket_mb` for tessel's wrapper. ``ddp_comm="torch"`` leaves DDP
    exactly as torch ships it (its own broadcast and all-reduce, bytes not counted, 25 MB buckets unless
    ``bucket_mb`` is given): the peer that benchmarks compare tessel's wrapper against.
    """
    device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
    if ddp_comm == "torch":
        return DDP(model, device_ids=device_ids, process_group=dp_group, bucket_cap_mb=bucket_mb or TORCH_BUCKET_MB)
    bucket_mb = bucket_mb or auto_bucket_mb(model)
    replicate_from_first(model, dp_group)
    ddp = DDP(model, device_ids=device_ids, process_group=dp_group, init_sync=False, forward_sync_buffers=False,
              bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    ddp.register_comm_hook(dp_group, comm.ddp_comm_hook("dp.dense"))
    return ddp


def apply_sparse(model: torch.nn.Module, cfg, batches: list[tuple], group, fixed: dict | None = None):
    """Take the model's sparse tables out of it per ``cfg.sparse`` (before DDP, which must not see them).

    ``fixed``: table name -> [strategy, split] to use as they are (a resumed run's saved plan)."""
    from . import sparse
    from .config import sparse_overrides
    from .sparse.rowopt import row_kind

    kind = row_kind(cfg.train.optimizer) if cfg.sparse.optimizer == "auto" else cfg.sparse.optimizer
    s = cfg.sparse
    return sparse.shard(model, batches, s.strategy, kind, cfg.train.lr, cfg.train.momentum, group,
                        sparse_overrides(cfg), s.max_touched, s.partitions, hosts=s.hosts or None,
                        timeout=cfg.parallel.timeout, split=s.split, schedule=s.schedule, link_mbit=s.link_mbit,
                        fixed=fixed)


def parallelize(model: torch.nn.Module, dims: ParallelDims, mesh, ddp_comm: str = "tessel",
                bucket_mb: float = 0.0) -> torch.nn.Module:
    """The model as this rank trains it under ``dims`` (pp > 1 goes through :func:`tessel.pipeline.build`,
    tp > 1 through :func:`tessel.tensor.parallelize` first)."""
    if dims.dp > 1:
        return apply_ddp(model, mesh.get_group("dp"), bucket_mb, ddp_comm)
    return model
