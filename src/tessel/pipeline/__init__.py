"""Pipeline parallelism: cut a plain model into stages, one per rank of the pp group, and run a schedule.

``build`` is what the training loop calls when pp > 1: rank 0 profiles the model's layers and chooses
the cut (every rank uses rank 0's plan), each rank keeps only its stage's layers, and the returned
engine steps like the data-parallel one. The pieces: ``layers`` (a model as a chain), ``partition``
(profile + min-max split), ``stage`` (p2p), ``schedules`` (op orders), ``predict`` (weight versions),
``runtime`` (the engine).

Example (4 stages, SpecTrain)::

    torchrun --nproc-per-node 4 -m tessel train --model classifier --model.layers 7 --pp 4 --micro-batches 4 \\
        --pipeline.schedule async-predict --optimizer sgd
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import comm
from ..errors import PlanError
from .layers import chain_of, check_no_shared, prune
from .partition import StagePlan, parse_split, plan_stages
from .predict import check_optimizer
from .runtime import PipelineEngine
from .schedules import check, check_micro
from .stage import Stage, StageRunner

__all__ = ["Built", "PipelineEngine", "StagePlan", "build", "chain_of", "check_config", "plan_stages"]


@dataclass
class Built:
    engine: PipelineEngine
    module: torch.nn.Module  # this rank's pruned model: what is checkpointed
    optimizer: torch.optim.Optimizer
    plan: StagePlan


def check_config(model: torch.nn.Module, cfg, dims):
    """What can be refused before any worker starts (the launcher runs this on a meta-device model)."""
    check(cfg.pipeline.schedule)
    check_micro(cfg.pipeline.schedule, dims.pp, cfg.train.micro_batches)
    if cfg.sparse.strategy not in ("auto", "dense") or cfg.sparse.tables:
        raise PlanError(f"sparse.strategy={cfg.sparse.strategy} with pp={dims.pp}: pipeline stages sync their "
                        "tables densely in this version; valid with pp > 1: sparse.strategy dense or auto")
    if cfg.pipeline.schedule == "async-predict":
        check_optimizer(cfg.train.optimizer, cfg.train.momentum)
    chain = chain_of(model)
    names = [layer.name for layer in chain.layers]
    if dims.pp > len(names):
        raise PlanError(f"pp={dims.pp} stages but the model has only {len(names)} pipeline layers "
                        f"({', '.join(names)}); valid: pp <= {len(names)}")
    if cfg.pipeline.split:
        parse_split(cfg.pipeline.split, len(names), dims.pp, names)
    return chain


def build(model: torch.nn.Module, cfg, mesh, dims, sample: tuple[torch.Tensor, torch.Tensor]) -> Built:
    """This rank's stage of ``model`` and the engine that trains it. ``sample``: this rank's first batch."""
    from ..parallelize import replicate_from_first
    from ..train.optim import build_optimizer

    schedule = cfg.pipeline.schedule
    m = cfg.train.micro_batches
    chain = check_config(model, cfg, dims)
    x, y = sample
    b = x.shape[0] // m
    pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    plan = None
    if dist.get_rank() == 0:
        plan = plan_stages(model, chain, x[:b], y[:b], dims.pp, cfg.pipeline.split).to_dict()
    plan = StagePlan.from_dict(comm.all_gather_object(plan, "meta")[0])
    check_no_shared(model, chain, plan.bounds)
    index = mesh.get_local_rank("pp")
    lo, hi = plan.bounds[index]
    root = prune(model, chain, lo, hi)
    runner = StageRunner(root, chain, lo, hi)
    if dims.dp > 1:
        replicate_from_first(runner, dp_group)
    optimizer = build_optimizer(runner.parameters(), cfg.train)
    dtype = next(runner.parameters()).dtype
    stage = Stage(runner, index, dims.pp, dist.get_process_group_ranks(pp_group), plan, b, dtype, pp_group)
    engine = PipelineEngine(stage, chain, optimizer, cfg.train, schedule, pp_group, dp_group, dims.dp,
                            cfg.pipeline.predict, plan)
    return Built(engine, root, optimizer, plan)
