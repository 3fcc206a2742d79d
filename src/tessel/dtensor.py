"""Whether a tensor is torch's DTensor, asked without importing DTensor.

Importing ``torch.distributed.tensor`` (with DCP and FSDP, which import it) costs a process about 40 MiB and most of
a second on the CPU. The launcher, its refusals, ``--help`` and the planner never need it, so tessel imports it only
where a run uses it: sharded weights, torch's tensor parallelism, checkpoints. (A process that makes a torch
optimizer has it anyway, a training worker or the planner's profile: torch's optimizers import ``torch._dynamo``,
which imports FSDP and DTensor.) A process that never imported it holds no DTensor, so the check needs no import.
"""

from __future__ import annotations

import sys

import torch


def is_dtensor(t: torch.Tensor) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)
