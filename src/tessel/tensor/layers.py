"""Tensor-parallel layers built from a plain layer's full weights and a spec from :mod:`.layout`.

Each parameter carries ``tp_split`` (how it is cut) and ``tp_partial`` (grid axes over which its copies
see different rows, so their gradients are partial sums): :class:`tessel.tensor.TensorParallel` sums
those after backward, counts each element once in the gradient norm, and turns the split into DTensor
placements for checkpoints.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import comm
from ..errors import PlanError
from . import cost, ops
from .grid import Grid, Split
from .layout import EmbeddingSpec, Layout, LinearSpec


def shard_param(grid: Grid, full: torch.Tensor, split: Split, partial: tuple[str, ...], what: str) -> nn.Parameter:
    p = nn.Parameter(grid.local(full.detach(), split, what))
    p.tp_split, p.tp_partial = split, tuple(a for a in partial if grid.size(a) > 1)
    return p


def linear(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None], spec: LinearSpec,
           grid: Grid, regather: bool) -> torch.Tensor:
    """One sharded GEMM for several linears that share their input (q, k, v), outputs side by side."""
    # in the GEMM's dtype before the copy (a no-op but under mixed precision): the gradient it sums is then bf16
    x = ops.copy(ops.wire(x), grid.group(spec.copy))
    y = ops.matmul(x, weights, grid.group(spec.x_gather), spec.x_dim, grid.group(spec.w_gather), 1, regather,
                   grid.live_weights)
    y = ops.reduce_scatter(y, grid.group(spec.reduce_scatter), 0)
    y = ops.all_reduce(y, grid.group(spec.all_reduce))
    if biases[0] is not None:
        y = y + (biases[0] if len(biases) == 1 else torch.cat(biases))
    return y


class TPLinear(nn.Module):
    """An nn.Linear cut by ``spec``; parameters keep the names ``weight`` and ``bias``."""

    def __init__(self, full: nn.Linear, spec: LinearSpec, grid: Grid, regather: bool = False, name: str = "",
                 channel: str = ops.CHANNEL) -> None:
        super().__init__()
        self.spec, self.grid, self.regather, self.name, self.channel = spec, grid, regather, name, channel
        self.in_features = full.in_features // grid.size(spec.inp.cols)
        self.weight = shard_param(grid, full.weight, spec.weight, (), f"{name}.weight")
        self.bias = (shard_param(grid, full.bias, spec.bias, spec.out.rows, f"{name}.bias")
                     if full.bias is not None else None)

    def check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.in_features:
            raise PlanError(f"{self.name}: input has {x.shape[-1]} features per rank but layout {self.spec.inp} "
                            f"({self.grid.spec}) gives {self.in_features}; the previous layer's output layout "
                            "does not match this layer's input")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        with ops.channel(self.channel):  # the head counts on tp.head, the blocks' linears on tp
            return linear(x, [self.weight], [self.bias], self.spec, self.grid, self.regather)


class _DistLayerNorm(torch.autograd.Function):
    """LayerNorm over a feature dim split across ``group``: two all-reduces forward, one backward.

    Keeps only the normalized shard and 1/std for backward, as much as torch's own LayerNorm keeps."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, features, eps):
        xs = ops.exact(x)  # statistics in fp32 under mixed precision
        s = torch.stack([xs.sum(-1), xs.pow(2).sum(-1)])
        s = ops.all_reduce_raw(s, group)
        mean = s[0] / features
        var = (s[1] / features - mean.pow(2)).clamp_min(0)
        rstd = torch.rsqrt(var + eps).unsqueeze(-1)
        xhat = (x - mean.unsqueeze(-1)) * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.group, ctx.features, ctx.channel = group, features, ops.current()
        return xhat * weight + bias

    @staticmethod
    def backward(ctx, dy):
        xhat, rstd, weight = ctx.saved_tensors
        g = dy * weight
        s = ops.all_reduce_raw(torch.stack([g.sum(-1), (g * xhat).sum(-1)]), ctx.group, ctx.channel) / ctx.features
        dx = rstd * (g - s[0].unsqueeze(-1) - xhat * s[1].unsqueeze(-1))
        rows = tuple(range(dy.dim() - 1))
        return dx, (dy * xhat).sum(rows), dy.sum(rows), None, None, None


class TPLayerNorm(nn.Module):
    def __init__(self, full: nn.LayerNorm, layout: Layout, grid: Grid, name: str = "") -> None:
        super().__init__()
        self.grid, self.layout, self.eps = grid, layout, full.eps
        self.features = full.normalized_shape[-1]
        split = Split.of(d0=layout.cols) if layout.cols else Split()
        self.weight = shard_param(grid, full.weight, split, layout.rows, f"{name}.weight")
        self.bias = shard_param(grid, full.bias, split, layout.rows, f"{name}.bias")

    def traffic(self, rows: int, recompute: bool = False) -> list[tuple[str, str, float, int, int]]:
        """(channel, grid axis, elements sent, ring steps, calls) per micro-batch of ``rows`` tokens (tensor.cost)."""
        return [("tp.norm", *t) for t in cost.norm_traffic(self.layout, self.grid.sizes, rows, recompute)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.grid.group(self.layout.cols)
        if group is None:
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        with ops.channel("tp.norm"):
            return _DistLayerNorm.apply(x, self.weight, self.bias, group, self.features, self.eps)


class TPEmbedding(nn.Module):
    """Token embedding with the vocabulary cut over the grid (Megatron's masked lookup in 1-D)."""

    def __init__(self, full: nn.Embedding, spec: EmbeddingSpec, grid: Grid, name: str = "tok_emb") -> None:
        super().__init__()
        self.spec, self.grid = spec, grid
        self.weight = shard_param(grid, full.weight, spec.weight, (), f"{name}.weight")
        rows = self.weight.shape[0] * grid.size(spec.w_gather)
        self.lo = (grid.block((spec.vocab,))[0] * rows) if spec.vocab else 0
        self.rows = rows
        self.shard = (self.weight.numel(), self.weight.shape[1])  # elements, features per token: kept if served
        self.table: nn.Module | None = None  # this rank's rows served over the dp group (tessel.sparse)

    def row_part(self) -> tuple[nn.Embedding, int] | None:
        """(an nn.Embedding over the vocabulary rows this rank holds, the first row's id), for serving them row
        by row; None where the layout also cuts the columns or gathers rows every step (2-D, 3-D)."""
        if self.spec.w_gather or self.spec.ids_rows or any(d == 1 for d, _ in self.spec.weight.dims):
            return None
        return nn.Embedding(*self.weight.shape, _weight=self.weight.detach()), self.lo

    def serve_rows(self, table: nn.Module) -> None:
        """Look rows up in ``table`` (a tessel.sparse row table over the same rows) instead of the parameter."""
        del self.weight  # the table holds (and updates) the rows now: no dense gradient, no dp all-reduce
        self.table = table

    def traffic(self, rows: int, recompute: bool = False) -> list[tuple[str, str, float, int, int]]:
        """(channel, grid axis, elements sent, ring steps, calls) per micro-batch of ``rows`` tokens (tensor.cost)."""
        return [("tp.embed", *t) for t in cost.embedding_traffic(self.spec, self.grid.sizes, *self.shard, rows,
                                                                  recompute)]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids``: the dp rank's whole batch (B, T); returns this rank's block of the residual layout."""
        with ops.channel("tp.embed"):
            return self._lookup(ids) if self.table is None else self._served(ids)

    def _served(self, ids: torch.Tensor) -> torch.Tensor:
        # only the ids in this rank's vocabulary range are looked up (others would touch row 0 for nothing)
        local = ids - self.lo
        inside = (local >= 0) & (local < self.rows)
        rows = self.table(local[inside])  # (k, dim)
        y = rows.new_zeros(*ids.shape, rows.shape[-1]).index_put((inside,), rows)
        return ops.all_reduce(ops.wire(y), self.grid.group(self.spec.all_reduce))  # an activation: bf16 if mixed

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        ids = rows_of(self.grid, ids, self.spec.ids_rows, "token ids")
        w = ops.gather(self.weight, self.grid.group(self.spec.w_gather), 0)
        if self.spec.vocab and self.grid.size(self.spec.vocab) > 1:
            local = ids - self.lo
            outside = (local < 0) | (local >= self.rows)
            y = F.embedding(local.masked_fill(outside, 0), w).masked_fill(outside.unsqueeze(-1), 0.0)
        else:
            y = F.embedding(ids, w)
        y = ops.reduce_scatter(ops.wire(y), self.grid.group(self.spec.reduce_scatter), 0)  # bf16 if mixed
        return ops.all_reduce(y, self.grid.group(self.spec.all_reduce))


class TPPositions(nn.Module):
    """Learned positions: features cut like the residual stream, the rest replicated."""

    def __init__(self, full: nn.Embedding, layout: Layout, grid: Grid, name: str = "pos_emb") -> None:
        super().__init__()
        split = Split.of(d1=layout.cols) if layout.cols else Split()
        self.weight = shard_param(grid, full.weight, split, layout.rows, f"{name}.weight")

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """(T,) positions -> (T, this rank's features), as the plain nn.Embedding is called."""
        return F.embedding(positions, self.weight)


def block_of(grid: Grid, full: torch.Tensor, layout: Layout, what: str = "activation") -> torch.Tensor:
    """This rank's block of a whole (dp-local) activation (B, ..., F) in ``layout``."""
    x = rows_of(grid, full, layout.rows, what)
    if layout.cols:
        index, count = grid.block((layout.cols,))
        x = x.chunk(count, -1)[index]
    return x


def block_shape(grid: Grid, shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
    """The shape of this rank's block of a (B, ..., F) tensor of ``shape`` in ``layout``."""
    rows, cols = grid.block(layout.rows)[1], grid.size(layout.cols)
    return (shape[0] // rows, *shape[1:-1], shape[-1] // cols)


def rows_of(grid: Grid, batch: torch.Tensor, axes: tuple[str, ...], what: str) -> torch.Tensor:
    """This rank's block of a whole (dp-local) batch along dim 0, for a layout cut by ``axes``."""
    index, count = grid.block(axes)
    if batch.shape[0] % count:
        raise PlanError(f"{what}: a batch of {batch.shape[0]} per data-parallel rank does not split into {count} "
                        f"blocks over grid axes {'.'.join(axes)} ({grid.spec}); use a batch divisible by {count}")
    return batch.chunk(count, 0)[index] if count > 1 else batch


class _VocabCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of logits whose vocabulary is split over ``group`` (Megatron's)."""

    @staticmethod
    def forward(ctx, logits, targets, group, lo):
        logits = ops.exact(logits)  # the loss and its softmax in fp32 under mixed precision
        m = logits.max(-1).values
        if group is not None:
            comm.all_reduce(m, ops.current(), op=dist.ReduceOp.MAX, group=group)
        # one (rows, V/p) tensor beside the logits: shifted, then exponentiated and normalised in place into the
        # softmax the backward keeps
        z = logits - m.unsqueeze(-1)
        local = targets - lo
        inside = (local >= 0) & (local < logits.shape[-1])
        idx = local.clamp(0, logits.shape[-1] - 1)
        picked = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * inside
        e = z.exp_()
        s = ops.all_reduce_raw(torch.stack([e.sum(-1), picked]), group)
        ctx.save_for_backward(e.div_(s[0].unsqueeze(-1)), idx, inside)
        return s[0].log() - s[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dloss):
        # the saved softmax becomes the logits' gradient in place (Megatron's way: no second (rows, V/p) tensor), so
        # a graph through this loss is differentiated once: tessel never retains one, and once_differentiable
        # refuses a backward of this backward
        grad, idx, inside = ctx.saved_tensors
        grad.scatter_add_(-1, idx.unsqueeze(-1), -inside.to(grad.dtype).unsqueeze(-1))
        return grad.mul_(dloss.unsqueeze(-1)), None, None, None


def vocab_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, layout: Layout, grid: Grid,
                        total_rows: int) -> torch.Tensor:
    """Mean cross-entropy over the dp rank's whole batch, from this rank's block of the logits."""
    group = grid.group(layout.cols)
    lo = grid.block((layout.cols,))[0] * logits.shape[-1] if layout.cols else 0
    per_row = _VocabCrossEntropy.apply(logits, targets, group, lo)
    total = per_row.sum().reshape(1)
    for axis in layout.rows:
        total = ops.all_reduce(total, grid.group(axis))  # the loss is then whole on every rank
    return total[0] / total_rows
