"""The trained model back as a plain module: every pipeline stage, tensor-parallel shard and served table put back
whole, on every rank, from what ``tessel.prepare`` returned; or a tessel checkpoint loaded into a plain model in
one process.

    model, optimizer, loader = tessel.prepare(model, optimizer, loader, plan=tessel.ParallelPlan(dp=2, pp=2))
    ...                                   # train
    plain = tessel.unwrap(model)          # every rank calls it (collectives); each gets the whole model
    if dist.get_rank() == 0:
        plain.save_pretrained("out")      # a Hugging Face model stays one: from_pretrained loads the folder

    tessel.load_into("ckpt", plain_model)  # one process, no torchrun: a checkpoint of any layout into a plain model

Collectives go through :mod:`tessel.comm` on channel ``unwrap`` (and ``tp.gather``, ``ps.gather``,
``a2a.gather`` for shards and tables).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from . import comm
from .errors import CheckpointError, TesselError
from .sparse import full_table


def skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the meta device (no memory): the plain architecture :func:`unwrap` fills again."""
    memo = {id(t): (nn.Parameter(torch.empty_like(t, device="meta"), t.requires_grad) if isinstance(t, nn.Parameter)
                    else torch.empty_like(t, device="meta"))
            for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def _unsharded(p: torch.Tensor, shards=None) -> torch.Tensor:
    """A weight whole over data parallelism: FSDP's shard (a DTensor cut on dim 0 over ``shards``, the group
    ``dp_shard`` spans, or where the caller names none, its own 1-D mesh's group: beside pipeline stages and
    tensor-parallel blocks) gathered, else itself."""
    if not hasattr(p, "device_mesh"):
        return p.detach()
    from . import fsdp  # torch's FSDP and DTensor take a second to import: only where weights are sharded

    return fsdp.whole(p.detach(), shards if shards is not None else p.device_mesh.get_group())


def _local(module: nn.Module, tables, tp, shards=None) -> dict[str, torch.Tensor]:
    """This rank's tensors under their plain names, served tables whole over dp, FSDP's shards (over ``shards``
    where given) and then tensor-parallel blocks whole."""
    out = {n: _unsharded(p, shards) for n, p in module.named_parameters()}
    out.update({n: b.detach() for n, b in module.named_buffers()})
    for name, t in (tables.tables.items() if tables else ()):
        out[f"{name}.weight"] = full_table(t)  # a collective over the table's dp group
    if tp is not None:
        splits = {n.removeprefix("module."): p.tp_split for n, p in tp.named}
        for name, split in splits.items():
            if name in out:
                out[name] = tp.grid.whole(out[name], split)
    return out


def full_state(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the plain model, whole, under its plain name, on every rank (collective: every
    rank calls it). ``model``: what ``tessel.prepare`` returned."""
    parts = model.checkpoint_parts(None)
    mine = _local(parts["module"], parts["tables"], parts["tp"], parts.get("shards"))
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    # pipeline stages hold different names: each tensor comes from the lowest rank that has it
    held = comm.all_gather_object({n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in mine.items()},
                                  "unwrap")
    out, dev = {}, next((t.device for t in mine.values()), comm.device())
    for name in sorted({n for h in held for n in h}):
        src = next(r for r, h in enumerate(held) if name in h)
        shape, dtype = held[src][name]
        t = mine[name].clone() if name in mine and dist.get_rank() == src else torch.empty(
            shape, dtype=getattr(torch, dtype), device=dev)
        comm.broadcast(t, src, "unwrap")
        out[name] = t
    return out


def unwrap(model) -> nn.Module:
    """The plain model the user gave ``tessel.prepare``, trained: its own class and structure, every weight whole,
    on the CPU, in every rank (collective: every rank calls it)."""
    plain = getattr(model, "skeleton", None)
    if plain is None:
        raise TesselError("tessel.unwrap takes the model tessel.prepare returned")
    out = copy.deepcopy(plain)
    _fill(out, full_state(model))
    return out


def _fill(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Give every parameter and buffer of the meta-device ``module`` its tensor from ``state``, in place. A weight
    several modules share (a tied head) stays one: it is made once, from whichever of its names ``state`` has."""
    made: dict[int, torch.Tensor] = {}
    for kind, named in (("p", module.named_parameters(remove_duplicate=False)),
                        ("b", module.named_buffers(remove_duplicate=False))):
        for name, t in list(named):
            if id(t) not in made:
                names = [n for n, u in _all(module, kind) if u is t]
                found = next((n for n in names if n in state), None)
                if found is None:
                    raise TesselError(f"the trained model has no {name}: it was not built from the model prepare "
                                      "was given")
                value = state[found].to(t.dtype).clone()
                made[id(t)] = nn.Parameter(value, t.requires_grad) if kind == "p" else value
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, leaf, made[id(t)])


def _all(module: nn.Module, kind: str):
    return (module.named_parameters(remove_duplicate=False) if kind == "p"
            else module.named_buffers(remove_duplicate=False))


def load_into(path: str | Path, model: nn.Module) -> nn.Module:
    """Load a tessel checkpoint (``path``: one checkpoint, or a folder of them: the newest intact one) into the plain
    ``model`` in one process, whatever layout saved it; checksums are checked first. Returns ``model``."""
    from .train import checkpoint

    found = checkpoint.find(path)
    if found is None:
        raise CheckpointError(f"'{path}' holds no intact tessel checkpoint")
    checkpoint.load_weights(found, model, None)
    return model
