"""Sharded data parallelism: torch's FSDP2 (``fully_shard``) over the dp ranks, every byte through tessel.comm.

Each dp rank keeps 1/dp of every weight, gradient and optimizer state (ZeRO-3). A layer's weights are gathered
whole just before its forward and again before its backward (``reshard_after_forward``), and its gradients are
reduce-scattered as its backward ends, so a rank holds one layer unsharded at a time, not the model. Units are
the model's chain layers (the modules each layer owns, from :mod:`tessel.chain`'s registry), then the root for
what is left; a model with no registered chain is one unit. Served tables stay out: their rows live on their
owners, and they hold no parameters for FSDP to shard.

The all-gather and the reduce-scatter are FSDP's own, given tessel.comm calls (``set_custom_all_gather``):
``dp.gather`` counts (P − 1) · shard bytes per gather, ``dp.scatter`` (P − 1)/P of each reduce-scatter's input
(an all-to-all and a local sum, tessel.comm's reduce-scatter). FSDP is told to sum (``set_force_sum_reduction_
for_comms``) and divides by P itself, as DDP's mean does. Under bf16-mixed the gathered weights are bf16 (half
the gather bytes) and the gradients are reduced in fp32 (gloo cannot sum bf16; torchtitan reduces in fp32).

HSDP (dp_shard < dp): each group of dp_shard consecutive dp ranks shards the weights among itself, and the
dp / dp_shard groups are replicas; a unit's reduce-scattered gradient is then summed over the replicas
(``dp.replicate``, FSDP's all-reduce hook given a tessel.comm call: torch's own HSDP all-reduce would not be
counted) before FSDP divides by all dp ranks.

Example::

    model = apply_fsdp(model, mesh["dp"], [model.blocks[0], model.blocks[1]])
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from . import comm


class _Alloc:
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class Gather(_Alloc, AllGather):
    """FSDP's all-gather of a unit's shards as one tessel.comm call (synchronous: FSDP waits on torch's Work type
    only, so an asynchronous handle of ours would not be waited for)."""

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        comm.all_gather_into(output_tensor, input_tensor, "dp.gather", group)


class Scatter(_Alloc, ReduceScatter):
    """FSDP's reduce-scatter of a unit's gradients as one tessel.comm call (a sum; FSDP divides after)."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        if op != dist.ReduceOp.SUM:  # set_force_sum_reduction_for_comms makes every call a sum
            raise RuntimeError(f"FSDP asked tessel.comm for a reduce-scatter with {op}; it sums only")
        comm.reduce_scatter(output_tensor, input_tensor, "dp.scatter", group)


class Replicate:
    """HSDP's second sum: a unit's reduce-scattered gradient shard summed over the replicas holding the same shard
    (FSDP's all-reduce hook, run after its reduce-scatter and before it divides by all dp ranks)."""

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, shard: torch.Tensor) -> None:
        comm.all_reduce(shard, "dp.replicate", group=self.group)


def units(model: nn.Module, owned: list[tuple[str, ...]]) -> list[nn.Module]:
    """The submodules to shard one by one: those the chain's layers own, in order, that hold parameters none of
    which is also referenced outside them (a tied weight stays with the root)."""
    total = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    out: list[nn.Module] = []
    for path in (path for paths in owned for path in paths if path):
        m = model.get_submodule(path)
        inside = Counter(id(p) for _, p in m.named_parameters(remove_duplicate=False))
        if (any(m is u for u in out) or next(m.parameters(), None) is None
                or any(total[i] != n for i, n in inside.items())):
            continue
        out.append(m)
    return out


def apply_fsdp(model: nn.Module, shard_mesh, unit_modules: list[nn.Module],
               param_dtype: torch.dtype | None = None, replicate_group=None,
               reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """``fully_shard`` each of ``unit_modules``, then ``model``, over the ranks of ``shard_mesh`` (1-D); gathers
    in ``param_dtype`` (None: the weights' own), gradients reduced in ``reduce_dtype`` (None: the weights' dtype;
    bf16 when asked: each term rounded once, tessel.comm sums the terms in fp32). ``replicate_group``
    (HSDP): the ranks holding the same shards, over which each reduce-scattered gradient is summed again before
    FSDP divides by all of them. Returns ``model`` (now an FSDPModule)."""
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    reduce_dtype = reduce_dtype or (dtype if param_dtype else None)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for m in [*unit_modules, model]:
        fully_shard(m, mesh=shard_mesh, mp_policy=policy, reshard_after_forward=True)
    _prefetch_in_chain_order(model, unit_modules)
    replicas = dist.get_world_size(replicate_group) if replicate_group is not None else 1
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_custom_all_gather(Gather())
            m.set_custom_reduce_scatter(Scatter())
            m.set_force_sum_reduction_for_comms(True)
            if replicas > 1:  # torch's own HSDP all-reduce would bypass tessel.comm; the hook goes through it
                m.set_all_reduce_hook(Replicate(replicate_group))
                m.set_gradient_divide_factor(float(shard_mesh.size() * replicas))
    return model


def _prefetch_in_chain_order(model: nn.Module, unit_modules: list[nn.Module]) -> None:
    """Each unit's backward prefetches the unit before it in the chain; the first unit and the root prefetch
    nothing. torch's default walks back along the forwards' order instead, and on a pipeline stage that order holds
    every micro-batch's forwards: the first micro-batch's backward, reaching the stage's first unit, would prefetch
    the stage's last unit of the micro-batch before, gather it and drop it unused, one unit's gather a step
    (bench/plan-head/fsdp_bytes.txt). The root's backward hook fires where its output's gradient arrives, which on
    a last stage is after the head (run outside the root) and the blocks, so it has no unit to prefetch either.
    Those two list themselves, a no-op (unsharded by then): an empty list would mean torch's default again. A model
    with no registered chain is the root alone, which has nothing to prefetch."""
    for before, unit in zip(unit_modules[:1] + unit_modules[:-1], unit_modules):
        unit.set_modules_to_backward_prefetch([before])
    model.set_modules_to_backward_prefetch([model])


def whole(t: torch.Tensor, group) -> torch.Tensor:
    """A weight FSDP holds in shards (a DTensor split on dim 0 over ``group``, as ``torch.chunk`` splits it: the
    first ranks ⌈n/P⌉ rows each, the last short or empty) whole on every rank, gathered through tessel.comm."""
    local, p = t.to_local(), dist.get_world_size(group)
    rows = -(-t.shape[0] // p)
    padded = local.new_zeros((rows, *t.shape[1:]))
    padded[: local.shape[0]] = local
    out = local.new_empty((rows * p, *t.shape[1:]))
    comm.all_gather_into(out, padded, "unwrap", group)
    return out[: t.shape[0]]


def shard_like(t: torch.Tensor, param: torch.Tensor, group) -> torch.Tensor:
    """``t`` (whole, the shape of the weight ``param`` FSDP now holds in shards over ``group``) cut as the weight
    is: this rank's ``torch.chunk`` of dim 0, as a DTensor like ``param``. Every rank holds ``t`` whole already
    (an optimizer's state made before sharding), so nothing is sent."""
    from torch.distributed.tensor import DTensor

    p, me = dist.get_world_size(group), dist.get_rank(group)
    chunks = torch.chunk(t, p, dim=0)
    mine = chunks[me] if me < len(chunks) else t.new_empty((0, *t.shape[1:]))
    return DTensor.from_local(mine.clone(), param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())
