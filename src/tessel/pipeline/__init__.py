"""Pipeline parallelism: cut a plain model into stages, one per rank of the pp group, and run a schedule.

The composer (:mod:`tessel.parallelize`) calls ``cut``: rank 0 profiles the model's layers and chooses
the cut (every rank uses rank 0's plan); then ``prune`` keeps only this rank's stage's layers, and a
``PipelineEngine`` steps the stage like the unpipelined engine. The pieces: ``layers`` (pruning a
chain), ``partition`` (profile + min-max split), ``stage`` (p2p), ``schedules`` (op orders),
``predict`` (weight versions), ``runtime`` (the engine).

Example (4 stages, SpecTrain)::

    torchrun --nproc-per-node 4 -m tessel train --model classifier --model.layers 7 --pp 4 --micro-batches 4 \\
        --pipeline.schedule async-predict --optimizer sgd
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm
from ..chain import Chain
from ..errors import PlanError
from .layers import check_ties, prune, ties
from .partition import StagePlan, parse_split, plan_stages, split_text
from .runtime import PipelineEngine, TorchPipelineEngine, summary
from .schedules import chunks, held
from .stage import Stage


def check_model(chain: Chain, stages: int, bounds: tuple = ()) -> None:
    """What the model's layers allow of ``stages`` stages cut at ``bounds`` (the launcher runs this on a
    meta-device model)."""
    names = chain.names
    if stages > len(names):
        raise PlanError(f"pp={stages} stages but the model has only {len(names)} pipeline layers "
                        f"({', '.join(names)}); valid: pp <= {len(names)}")
    if bounds:
        parse_split(split_text(bounds), len(names), stages, names)


def cut(model: torch.nn.Module, chain: Chain, stages: int, sample: tuple[torch.Tensor, torch.Tensor],
        bounds: tuple = ()) -> StagePlan:
    """The stage plan every rank agrees on: rank 0 profiles the plain model on the micro-batch ``sample`` and
    cuts (``bounds``, given or a resumed run's, fix the cut but are profiled the same way, for the printout)."""
    check_model(chain, stages, bounds)
    given = split_text(bounds) if bounds else ""
    plan = None
    if dist.get_rank() == 0:
        with torch.random.fork_rng(devices=[]):  # the profile's draws (dropout, sampled candidates) leave no trace
            plan = plan_stages(model, chain, *sample, stages, given).to_dict()
    return StagePlan.from_dict(comm.from_rank_0(plan))


__all__ = ["PipelineEngine", "Stage", "StagePlan", "TorchPipelineEngine", "check_model", "check_ties", "chunks",
           "cut", "held", "prune", "split_text", "summary", "ties"]
