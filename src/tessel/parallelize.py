"""The composer: a plain model and a ParallelPlan in, this rank's trainable piece out.

``parallelize`` applies the plan's axes to a plain ``nn.Module`` in one order, each step behind its
predicate, as torchtitan's ``parallelize_llama`` does:

1. sparse tables out of the model (ps | allgather | alltoall | dense, over the dp group; pp=1, tp=1);
2. pipeline cut: rank 0 profiles the layer chain and cuts it, this rank keeps its stage (pp > 1);
3. tensor parallelism on the modules the stage holds, through the function registered for the model
   (tp > 1); stage boundary messages become this rank's block of the activation;
4. data-parallel sync: DDP for an unpipelined model, the step tail's flat all-reduce for a stage.

It returns a :class:`Parallelized`, which the trainer steps, checkpoints and summarises without knowing
which axes are on. Run it inside a torchrun worker, e.g.::

    torchrun --nproc-per-node 8 -m tessel train --dp 2 --pp 2 --tp 2 --tp-mode 1d
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import comm, pipeline, sparse, tensor
from .chain import Chain, Runner, chain_of
from .config import Config, sparse_overrides
from .plan import ParallelPlan, TableChoice
from .sparse.rowopt import row_kind
from .tensor.cost import step_formula
from .train.engine import Engine
from .train.optim import build_optimizer
from .train.tail import StepTail


def replicate_from_first(module: torch.nn.Module, group) -> None:
    """Make every rank of ``group`` hold the first rank's parameters and buffers (counted on dp.init)."""
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


@dataclass
class Parallelized:
    """This rank's share of the model, ready to train."""

    module: torch.nn.Module  # what is checkpointed: the plain model's names, pruned to the stage, tp layers in it
    optimizer: torch.optim.Optimizer
    engine: Any  # Engine or PipelineEngine: step(x, y, step, next_x) -> StepResult, drain(step), stats()
    plan: ParallelPlan  # complete: stage bounds and table strategies decided
    cfg: Config
    tables: sparse.SparseTables | None = None
    shards: tensor.TensorParallel | None = None  # places of tensor-parallel shards in full tensors (checkpoints)
    stages: pipeline.StagePlan | None = None

    def describe(self) -> str:
        """The plan as printed at start: degrees and schedule, then the stage cut and the table plan."""
        parts = [self.plan.describe()]
        if self.stages is not None:
            parts.append(self.stages.describe())
        if self.tables and self.tables.choices:
            parts.append(self.tables.describe())
        return "\n".join(parts)

    def dense_tables(self) -> list[tuple[torch.nn.Parameter, bool]]:
        """(weight, has sparse gradient) of the tables left in the model (dense / torch-sparse)."""
        choices = self.tables.choices if self.tables else []
        return [(self.module.get_submodule(c.info.name).weight, c.strategy == "torch-sparse") for c in choices
                if c.strategy in ("dense", "torch-sparse")]

    def summary(self, stats: list) -> dict:
        """The run summary's entries about the axes, from every rank's ``engine.stats()``."""
        plan, cfg = self.plan, self.cfg
        out: dict[str, Any] = {"plan": plan.to_dict(), "sparse_plan": {
            t.name: t.strategy + (f"/{t.split}" if t.strategy == "alltoall" else "") for t in plan.tables}}
        if plan.tp > 1:
            spec = tensor.GridSpec(plan.tp_mode, plan.tp_grid)
            out["tensor"] = str(spec) + (" regather" if plan.regather else "")
            if plan.pp == 1:  # the formula counts every block; a stage holds only some
                out["tensor_formula"] = step_formula(cfg, plan.dp, spec)
        if self.stages is not None:
            out["pipeline"] = pipeline.summary(stats, self.stages, plan.schedule, plan.micro_batches, plan.predict)
        return out


def apply_sparse(model: torch.nn.Module, plan: ParallelPlan, cfg: Config, group, batches: list[tuple]):
    """Take the model's sparse tables out of it (before DDP, which must not see them); a plan that already
    names its tables (a resumed run's) keeps them. Returns (tables, the plan with its tables decided)."""
    s = cfg.sparse
    kind = row_kind(cfg.train.optimizer) if s.optimizer == "auto" else s.optimizer
    fixed = {t.name: [t.strategy, t.split] for t in plan.tables} or None
    tables = sparse.shard(model, batches[:s.sample_batches], s.strategy, kind, cfg.train.lr, cfg.train.momentum,
                          group, sparse_overrides(cfg), s.max_touched, s.partitions, hosts=s.hosts or None,
                          timeout=cfg.parallel.timeout, split=s.split, schedule=s.schedule,
                          link_mbit=s.link_mbit, fixed=fixed)
    decided = tuple(TableChoice(c.info.name, c.strategy, c.split if c.strategy == "alltoall" else "")
                    for c in tables.choices)
    return tables, plan.with_(tables=decided)


def check_model(model: torch.nn.Module, plan: ParallelPlan, cfg: Config) -> None:
    """What the model itself allows of ``plan`` (layer count, even splits on the grid), checked on a meta-device
    model before any worker starts; ``model`` is changed in place."""
    if plan.pp == 1 and plan.tp == 1:
        return
    chain = chain_of(model)
    if plan.pp > 1:
        pipeline.check_model(chain, plan.pp, cfg.pipeline.split)
    if plan.tp > 1:
        per_rank = cfg.train.global_batch // (plan.dp * plan.micro_batches)
        tensor.check_shapes(model, chain, tensor.GridSpec(plan.tp_mode, plan.tp_grid), per_rank)


def _micro(batch: tuple, micro_batches: int) -> tuple:
    """The first micro-batch of ``batch``: what the pipeline profile times each layer on."""
    x, y = batch
    b = x.shape[0] // micro_batches
    return x[:b], y[:b]


def parallelize(model: torch.nn.Module, plan: ParallelPlan, mesh, cfg: Config,
                batches: list[tuple]) -> Parallelized:
    """Apply ``plan`` to the plain ``model`` (same seed, so the same weights, on every rank) on ``mesh``.

    ``batches``: this rank's first batches (sparse tables measure them, the pipeline profiles the first)."""
    dp_group = mesh.get_group("dp")
    tables = None
    if plan.pp == 1 and plan.tp == 1:
        tables, plan = apply_sparse(model, plan, cfg, dp_group, batches)
    chain = chain_of(model) if plan.pp > 1 or plan.tp > 1 else None
    root, stages, lo, hi = model, None, 0, None
    if plan.pp > 1:
        stages = pipeline.cut(model, chain, plan.pp, cfg.pipeline.split, _micro(batches[0], plan.micro_batches),
                              plan.bounds)
        plan = plan.with_(bounds=tuple(tuple(b) for b in stages.bounds))
        lo, hi = stages.bounds[mesh.get_local_rank("pp")]
        root = pipeline.prune(model, chain, lo, hi)
    handle = shards = None
    if plan.tp > 1 and plan.tp_mode == "torch-1d":
        root, handle = tensor.parallelize(root, plan.tp_mode, mesh, None)
    elif plan.tp > 1:
        chain, handle = tensor.apply(root, chain, tensor.GridSpec(plan.tp_mode, plan.tp_grid), mesh, plan.regather)
        shards = handle
    if plan.pp > 1:
        engine, optimizer = _stage_engine(root, chain, plan, cfg, mesh, stages, lo, hi, handle, batches[0])
    else:
        engine, optimizer = _engine(root, chain, plan, cfg, dp_group, handle, tables)
    return Parallelized(root, optimizer, engine, plan, cfg, tables, shards, stages)


def _engine(root, chain: Chain | None, plan: ParallelPlan, cfg: Config, dp_group, tp, tables):
    """One stage holding the whole model: DDP syncs gradients during backward."""
    model = Runner(root, chain) if chain is not None and plan.tp_mode != "torch-1d" else root
    if plan.dp > 1:
        ddp_comm = "torch" if cfg.sparse.strategy == "torch-sparse" else cfg.parallel.ddp_comm
        model = apply_ddp(model, dp_group, cfg.parallel.bucket_mb, ddp_comm)
    optimizer = build_optimizer(model.parameters(), cfg.train)
    params = [p for p in model.parameters() if p.requires_grad]
    return Engine(model, StepTail(params, optimizer, cfg.train, tp=tp, tables=tables), tables), optimizer


def _stage_engine(root, chain: Chain, plan: ParallelPlan, cfg: Config, mesh, stages, lo: int, hi: int, tp,
                  batch: tuple):
    """A pipeline stage: the step tail averages its gradients over its dp group and sums the norm over pp."""
    pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    runner = Runner(root, chain, lo, hi)
    if plan.dp > 1:
        replicate_from_first(runner, dp_group)
    optimizer = build_optimizer(runner.parameters(), cfg.train)
    params = [p for p in runner.parameters() if p.requires_grad]
    tail = StepTail(params, optimizer, cfg.train, dp_group=dp_group, tp=tp,
                    norm_group=pp_group)
    micro = batch[0].shape[0] // plan.micro_batches
    stage = pipeline.Stage(runner, mesh.get_local_rank("pp"), plan.pp, dist.get_process_group_ranks(pp_group),
                           stages, micro, params[0].dtype, pp_group)
    return pipeline.PipelineEngine(stage, chain, tail, plan.schedule, plan.predict, stages), optimizer
