"""Weights made where they are kept: a rank that keeps part of the model never holds it whole.

Built as usual, every rank would first hold the whole model (4 bytes a weight in fp32) before FSDP, the pipeline
cut or tensor parallelism took its share, so the largest model a run could train would be bounded by one rank
holding it all. As in torchtitan, such a run instead builds the model on the meta device (shapes, no storage),
parallelizes it there (stages, tensor-parallel blocks, FSDP's shards), and only then makes each rank's own pieces
(:func:`materialize`). Their values are the whole model's: the model's registered ``init``
(:class:`tessel.registry.ModelSpec`) draws each weight from a generator of its own, so a weight is made whole,
one at a time, and cut to this rank's piece the way a checkpoint is loaded into any layout (FSDP's chunk of
dim 0, the tensor-parallel block). A run built this way is the run built whole, exactly (tests/test_compose.py).
"""

from __future__ import annotations

import torch

from .dtensor import is_dtensor
from .registry import spec_of


@torch.no_grad()
def materialize(outer: torch.nn.Module, module: torch.nn.Module, plain: torch.nn.Module, seed: int, device,
                shards=None) -> None:
    """Give ``outer`` (FSDP's root over this rank's share of a model built on the meta device) real storage on
    ``device``, and each weight of ``module`` (that share: the plain model's names, pruned to a stage,
    tensor-parallel blocks and FSDP shards in it) its piece of the value ``plain``'s class draws for it under
    ``seed`` (``plain``: the model as built, on the meta device); ``shards``: the tensor-parallel handle that
    places blocks in full tensors (checkpoints use the same)."""
    # to_empty makes new parameter objects (FSDP's keeps them, but not the attributes tessel tags them with: a
    # tensor-parallel split, which pieces are partial sums): the tags go back by name, the handle takes the new ones
    tags = {n: dict(vars(p)) for n, p in outer.named_parameters()}
    outer.to_empty(device=device)
    for n, p in outer.named_parameters():
        for k, v in tags.get(n, {}).items():
            if not hasattr(p, k):
                setattr(p, k, v)
    if shards is not None:
        shards.rebind(module)
    fill = _fill_sharded if any(is_dtensor(p) for p in module.parameters()) else _fill_blocks
    fill(module, plain, seed, shards)


def _fill_blocks(module, plain, seed: int, shards) -> None:
    """Weights unsharded over dp (whole, or tensor-parallel blocks cut here by the grid): no DTensor is needed, so
    none is imported (a second and 40 MiB on the CPU)."""
    init = spec_of(plain).init
    for name, value in module.state_dict().items():  # plain names: nothing wraps the model yet
        whole = torch.empty(value.shape if shards is None else shards.full_shape(name, value), dtype=value.dtype)
        init(plain, name, whole, seed)
        value.copy_(whole if shards is None else shards.block_of(name, whole))


def _fill_sharded(module, plain, seed: int, shards) -> None:
    """FSDP's shards (DTensors; under tensor parallelism chunks of blocks): each weight placed in its full tensor
    as a checkpoint is loaded, and this rank's piece cut from it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.tensor import DTensor, distribute_tensor

    init, options = spec_of(plain).init, StateDictOptions(flatten_optimizer_state_dict=True)
    state = get_model_state_dict(module, options=options)
    full_view = shards.to_dtensors(state) if shards is not None else state
    for name, value in full_view.items():
        whole = torch.empty(value.shape, dtype=value.dtype)  # one weight whole at a time, on the host
        init(plain, name, whole, seed)
        if isinstance(value, DTensor):  # this rank's piece, cut here (src_data_rank None: every rank has it)
            piece = distribute_tensor(whole, value.device_mesh, value.placements, src_data_rank=None).to_local()
            value.to_local().copy_(piece)
        else:
            value.copy_(whole)
    set_model_state_dict(module, shards.to_local(full_view) if shards is not None else full_view, options=options)
