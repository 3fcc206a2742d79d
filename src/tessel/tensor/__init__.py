"""Tensor parallelism: 1-D (Megatron), 2-D (SUMMA) and 3-D layers, plus torch's own 1-D for the Transformer LM.

``apply(root, chain, spec, mesh)`` puts tensor-parallel layers into the modules a model (or one pipeline
stage of it) holds, through the function registered for its class (the Transformer LM and the
classifier); the returned :class:`TensorParallel` is what the step tail and checkpoints use:
it sums partial gradients of replicated pieces, computes the global gradient norm, and turns local shards
into DTensors so DCP can save under one grid and load under another.

    tessel train --tp 8 --tp-mode 3d            # 2x2x2 on 8 local workers
    tessel train --tp 4 --tp-mode 2d            # 2x2
    tessel train --tp 4 --tp-mode 1d --dp 2     # tp x dp on 8 workers

Layouts and byte formulas: :mod:`tessel.tensor.layout`.
"""

from __future__ import annotations

import contextlib

import torch

from ..chain import Runner, chain_of
from ..errors import PlanError
from ..registry import registered, spec_of
from ..train.memory import local
from ..train.tail import squares
from . import model as _registers  # noqa: F401  (registers the reference models' tensor-parallel layers)
from .grid import Grid, GridSpec, Split
from .layout import plan_for


class TensorParallel:
    """Gradient reduction, gradient norm and checkpoint placements of one rank's tensor-parallel model."""

    def __init__(self, model: torch.nn.Module, grid: Grid) -> None:
        self.grid = grid
        self.named = [(n, p) for n, p in model.named_parameters() if hasattr(p, "tp_split")]
        self.params = [p for _, p in self.named]
        self.shard_group = None  # the dp ranks FSDP shares each block out among (None: not sharded)
        # FSDP's chunk for each whole block :meth:`to_dtensors` made (by its id), to cut it again on load
        self._chunks: dict[int, torch.Tensor] = {}

    def sharded(self, model: torch.nn.Module, group) -> None:
        """``model`` (the root this handle was made on) now has FSDP's parameters, each this rank's dim-0 chunk of
        its tensor-parallel block over the dp ranks of ``group``: they take over the old ones' splits. Sums and
        norms run on the chunks as they did on the blocks (every tp rank chunks its block alike). Checkpoints
        hold the blocks, gathered whole over ``group`` (a stage's block, what an unsharded rank holds anyway), so
        a checkpoint is the same under any dp_shard; DCP places each block in its full tensor as before."""
        self.rebind(model)
        self.shard_group = group

    def rebind(self, model: torch.nn.Module) -> None:
        """``model``'s parameters (new objects of the same names: FSDP's, or made from the meta device) take over
        the old ones' splits."""
        now = dict(model.named_parameters())  # a served table's weight is none of them: it keeps its entry
        for n, p in self.named:
            if n in now:
                now[n].tp_split, now[n].tp_partial = p.tp_split, p.tp_partial
        self.named = [(n, now.get(n, p)) for n, p in self.named]
        self.params = [p for _, p in self.named]

    def reduce_grads(self) -> None:
        """Sum the gradients of pieces replicated over rows-cut axes (biases, norms, positions): one flat
        buffer per set of axes, all-reduced over each axis in turn."""
        by_axes: dict[tuple[str, ...], list[torch.Tensor]] = {}
        for p in self.params:
            if p.tp_partial and p.grad is not None:
                by_axes.setdefault(p.tp_partial, []).append(local(p.grad))
        for axes, grads in by_axes.items():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.grid.all_reduce_over(flat, axes, "tp.grads")
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    @staticmethod
    def loss_context() -> contextlib.AbstractContextManager:
        """tessel's layers compute the loss as the plain model does: nothing to enter."""
        return contextlib.nullcontext()

    def finish_backward(self) -> torch.Tensor:
        """After the step's backward passes: partial gradients summed; returns the squared global norm."""
        self.reduce_grads()
        return self.grad_sq()

    def grad_sq(self) -> torch.Tensor:
        """Squared global gradient norm, every element counted once however many ranks hold it."""
        sq = torch.zeros(1, dtype=torch.float64, device=self.params[0].device)
        for p in self.params:
            if p.grad is not None:
                sq += squares(local(p.grad)) / self.grid.replicas(p.tp_split)
        return self.grid.all_reduce_over(sq, self.grid.names, "tp.grads")[0]

    def _splits(self) -> dict[str, Split]:
        return {n.removeprefix("module."): p.tp_split for n, p in self.named}

    def full_shape(self, name: str, block: torch.Tensor) -> torch.Size:
        """The shape of weight ``name`` whole, from this rank's ``block`` of it."""
        shape = list(block.shape)
        for d, axes in (self._splits().get(name) or Split()).dims:
            shape[d] *= self.grid.block(axes)[1]
        return torch.Size(shape)

    def block_of(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's block of weight ``name`` from its value ``whole`` (itself where the weight is not cut)."""
        split = self._splits().get(name)
        return whole if split is None else self.grid.local(whole, split, name)

    def to_dtensors(self, state: dict) -> dict:
        """Model or (flattened) optimizer state with every shard as a DTensor of its full shape."""
        from torch.distributed.tensor import DTensor

        splits, mesh, out = self._splits(), self.grid.submesh, {}
        for key, value in state.items():
            name = key.removeprefix("state.").rsplit(".", 1)[0] if key.startswith("state.") else key
            split = splits.get(name)
            if split is not None and torch.is_tensor(value) and value.dim() > 0:
                chunk = value if isinstance(value, DTensor) else None
                if chunk is not None:  # FSDP's chunk of the block: the block whole first (see :meth:`sharded`)
                    from ..fsdp import whole

                    value = whole(chunk, self.shard_group)
                shape = list(value.shape)
                for d, axes in split.dims:
                    shape[d] *= self.grid.block(axes)[1]
                value = DTensor.from_local(value, mesh, self.grid.placements(split), run_check=False,
                                           shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())
                if chunk is not None:
                    self._chunks[id(value)] = chunk
            out[key] = value
        return out

    def to_local(self, state: dict) -> dict:
        """``state`` from :meth:`to_dtensors` (DCP has loaded into it in place) as this rank's blocks, and under
        FSDP as the chunks of them it keeps (cut here, nothing sent)."""
        from torch.distributed.tensor import DTensor

        from ..fsdp import shard_like

        out = {}
        for k, v in state.items():
            chunk = self._chunks.pop(id(v), None)
            v = v.to_local() if isinstance(v, DTensor) else v
            out[k] = shard_like(v, chunk, self.shard_group) if chunk is not None else v
        return out


def apply(root: torch.nn.Module, chain, spec: GridSpec, mesh=None, regather: bool = False, dry: bool = False):
    """Tensor-parallel layers on the modules ``root`` holds (a whole model or one pipeline stage), in place.

    Returns (the chain that runs them, the :class:`TensorParallel` handle). ``mesh=None``: the grid as rank 0
    sees it without groups, to check shapes on a meta-device model before any worker starts; with ``dry``, on
    groups that only stand in for the grid's (:class:`tessel.comm.Dry`), to run the layers as rank 0 would."""
    fn = spec_of(root).tensor
    if fn is None:
        raise PlanError(f"no tensor-parallel layers are registered for {type(root).__name__} (registered: "
                        f"{', '.join(n for n in registered())}); use tp=1")
    grid = Grid(spec, mesh, dry)
    chain = fn(root, chain, grid, plan_for(spec.mode), regather)
    plain = [n for n, p in root.named_parameters() if not hasattr(p, "tp_split")]
    if plain:
        raise PlanError(f"tensor parallelism left parameter '{plain[0]}' of {type(root).__name__} unsplit; its "
                        "registered tensor function must replace every module that holds parameters")
    return chain, TensorParallel(root, grid)


def check_shapes(model: torch.nn.Module, chain, spec: GridSpec, batch_per_rank: int) -> None:
    """Every weight, head count and micro-batch must split evenly on the grid (model on the meta device; it
    is changed in place). torch's peer is checked as tessel's layers of its family would cut the model."""
    if spec.mode.torch_peer:
        _torch_plan(model)(model, None, False)
    chain, _ = apply(model, chain, spec)
    grid, plan = Grid(spec), plan_for(spec.mode)
    for layout in (plan.residual, plan.up.out, plan.down.inp):
        count = grid.block(layout.rows)[1]
        if batch_per_rank % count:
            raise PlanError(f"a micro-batch of {batch_per_rank} sequences per data-parallel rank does not split "
                            f"into {count} blocks over grid axes {'.'.join(layout.rows)} ({spec}); use a global "
                            f"batch whose micro-batches per dp rank are a multiple of {count}")


def _torch_plan(model: torch.nn.Module):
    fn = spec_of(model).torch_tensor
    if fn is None:
        raise PlanError(f"torch's own tensor parallelism (the peer) has no plan registered for {type(model).__name__}"
                        " (tessel.register_model(..., torch_tensor=...)); use tessel's modes 1d, 2d or 3d")
    return fn


def apply_whole(model: torch.nn.Module, spec: GridSpec, mesh, regather: bool = False,
                sequence_parallel: bool = False):
    """A whole model (no pipeline) made tensor-parallel: (module to train, its handle). tessel's modes give a
    :class:`tessel.chain.Runner` (call it with inputs and targets; its ``root`` is the model, names unchanged);
    torch's peer gives the model under torch's ``parallelize_module`` (with ``sequence_parallel``, torch's)."""
    if spec.mode.torch_peer:
        from .native import NativeTP

        model = _torch_plan(model)(model, mesh, sequence_parallel)
        return model, NativeTP(model, mesh)
    chain, handle = apply(model, chain_of(model), spec, mesh, regather)
    return Runner(model, chain), handle


__all__ = ["Grid", "GridSpec", "TensorParallel", "apply", "apply_whole", "check_shapes"]
