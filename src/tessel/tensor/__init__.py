"""Tensor parallelism for the Transformer LM: 1-D (Megatron), 2-D (SUMMA) and 3-D, plus torch's own 1-D.

``parallelize(model, mode, mesh, spec)`` replaces a plain TransformerLM by its tensor-parallel version on
this rank's block of the grid; the returned :class:`TensorParallel` is what the engine and checkpoints use:
it sums partial gradients of replicated pieces, computes the global gradient norm, and turns local shards
into DTensors so DCP can save under one grid and load under another.

    tessel train --tp 8 --tp-mode 3d            # 2x2x2 on 8 local workers
    tessel train --tp 4 --tp-mode 2d            # 2x2
    tessel train --tp 4 --tp-mode 1d --dp 2     # tp x dp on 8 workers

Layouts and byte formulas: :mod:`tessel.tensor.layout`.
"""

from __future__ import annotations

import torch

from ..errors import PlanError
from .grid import Grid, GridSpec, Split
from .layout import plan_for


class TensorParallel:
    """Gradient reduction, gradient norm and checkpoint placements of one rank's tensor-parallel model."""

    def __init__(self, model: torch.nn.Module, grid: Grid) -> None:
        self.grid = grid
        self.named = [(n, p) for n, p in model.named_parameters() if hasattr(p, "tp_split")]
        self.params = [p for _, p in self.named]

    def reduce_grads(self) -> None:
        """Sum the gradients of pieces replicated over rows-cut axes (biases, norms, positions): one flat
        buffer per set of axes, all-reduced over each axis in turn."""
        by_axes: dict[tuple[str, ...], list[torch.Tensor]] = {}
        for p in self.params:
            if p.tp_partial and p.grad is not None:
                by_axes.setdefault(p.tp_partial, []).append(p.grad)
        for axes, grads in by_axes.items():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.grid.all_reduce_over(flat, axes, "tp.grads")
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def finish_backward(self) -> torch.Tensor:
        """After the step's backward passes: partial gradients summed; returns the squared global norm."""
        self.reduce_grads()
        return self.grad_sq()

    def grad_sq(self) -> torch.Tensor:
        """Squared global gradient norm, every element counted once however many ranks hold it."""
        sq = torch.zeros(1, dtype=torch.float64)
        for p in self.params:
            if p.grad is not None:
                sq += p.grad.double().pow(2).sum() / self.grid.replicas(p.tp_split)
        return self.grid.all_reduce_over(sq, self.grid.names, "tp.grads")[0]

    def _splits(self) -> dict[str, Split]:
        return {n.removeprefix("module."): p.tp_split for n, p in self.named}

    def to_dtensors(self, state: dict) -> dict:
        """Model or (flattened) optimizer state with every shard as a DTensor of its full shape."""
        from torch.distributed.tensor import DTensor

        splits, mesh, out = self._splits(), self.grid.submesh, {}
        for key, value in state.items():
            name = key.removeprefix("state.").rsplit(".", 1)[0] if key.startswith("state.") else key
            split = splits.get(name)
            if split is not None and torch.is_tensor(value) and value.dim() > 0:
                shape = list(value.shape)
                for d, axes in split.dims:
                    shape[d] *= self.grid.block(axes)[1]
                value = DTensor.from_local(value, mesh, self.grid.placements(split), run_check=False,
                                           shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())
            out[key] = value
        return out

    def to_local(self, state: dict) -> dict:
        from torch.distributed.tensor import DTensor

        return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}


def check_config(cfg, tp: int) -> GridSpec:
    """The grid for ``cfg.tensor`` at ``tp`` ranks, or a one-line PlanError (before any worker starts)."""
    spec = GridSpec.parse(cfg.tensor.mode, tp, cfg.tensor.grid)
    if tp > 1 and cfg.model.name != "transformer_lm":
        raise PlanError(f"tensor parallelism (tp={tp}) applies to model transformer_lm, not '{cfg.model.name}'")
    if tp > 1 and cfg.parallel.pp > 1:
        raise PlanError("tensor parallelism with pipeline stages (tp>1 and pp>1) is not available yet; "
                        "use one of them")
    if cfg.tensor.mode == "torch-1d" and tp > 1 and cfg.parallel.dp not in (0, 1):
        raise PlanError("tensor.mode 'torch-1d' (the torch peer) runs with dp=1; use mode 1d to combine with dp")
    return spec


def check_shapes(model: torch.nn.Module, spec: GridSpec, batch_per_rank: int) -> None:
    """Every weight, head count and micro-batch must split evenly on the grid (model may be on meta)."""
    from .model import TPTransformerLM

    plan = plan_for("1d" if spec.mode == "torch-1d" else spec.mode)
    grid = Grid(GridSpec("1d" if spec.mode == "torch-1d" else spec.mode, spec.shape))
    TPTransformerLM(model, plan, grid)
    for layout in (plan.residual, plan.up.out, plan.down.inp):
        count = grid.block(layout.rows)[1]
        if batch_per_rank % count:
            raise PlanError(f"a micro-batch of {batch_per_rank} sequences per data-parallel rank does not split "
                            f"into {count} blocks over grid axes {'.'.join(layout.rows)} ({spec}); use a global "
                            f"batch whose micro-batches per dp rank are a multiple of {count}")


def parallelize(model: torch.nn.Module, mode: str, mesh, spec: GridSpec, regather: bool = False):
    """(model for this rank, its TensorParallel handle)."""
    if mode == "torch-1d":
        from .native import NativeTP, parallelize_native

        model = parallelize_native(model, mesh)
        return model, NativeTP(model, mesh)
    from .model import TPTransformerLM

    if not hasattr(model, "blocks") or not hasattr(model, "tok_emb"):
        raise PlanError(f"tensor parallelism applies to transformer_lm, not {type(model).__name__}")
    grid = Grid(spec, mesh)
    tp_model = TPTransformerLM(model, plan_for(mode), grid, regather)
    return tp_model, TensorParallel(tp_model, grid)


__all__ = ["Grid", "GridSpec", "TensorParallel", "check_config", "parallelize"]
