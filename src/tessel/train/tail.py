"""The one step tail every engine ends a step with: gradient hooks, global norm, clipping, LR, update.

Flushed and asynchronous pipelines and the unpipelined engine all finish a step here, in this order:

1. data-parallel sync, where DDP did not do it inside backward (pipeline stages: one flat all-reduce);
2. tensor parallelism's partial gradients summed over the grid; its share of the squared norm counts every
   element once however many ranks hold it;
3. sparse tables' row gradients pushed to their owners (their share of the norm comes back summed);
4. the squared norm summed over pipeline stages (``global_norm``; asynchronous schedules clip per stage);
5. torch's ``clip_grad_norm_`` rule over all of it, the LR of this step, the rows' update, the optimizer.

Example::

    tail = StepTail(params, optimizer, clip=1.0, tp=handle, norm_group=mesh.get_group("pp"))
    norm = tail(lr)          # after the step's backward passes
"""

from __future__ import annotations

import time

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import comm
from .memory import local
from .optim import set_lr


def clip_coef(norm: float, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s rule: the factor gradients are multiplied by (1.0: left as they are).

    >>> clip_coef(4.0, 1.0) < 0.25 < clip_coef(4.0, 1.0) + 1e-6, clip_coef(0.5, 1.0), clip_coef(4.0, 0.0)
    (True, 1.0, 0.0)
    """
    return min(1.0, max_norm / (norm + 1e-6))


def squares(g: torch.Tensor) -> torch.Tensor:
    """The sum of ``g``'s squared elements as an fp64 scalar: the norm in ``g``'s own width, at least fp32, as
    torch's clip_grad_norm_ takes it (an fp64 copy of every fp32 gradient cost three times the norm itself)."""
    return torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32)).double().square()


def local_sq(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """This rank's squared norm of ``params``' gradients, summed in fp64 (sparse gradients by their values).
    Dense ones are normed a dtype at a time in one fused call (``_foreach_norm``, as torch's clip_grad_norm_):
    a loop over a GPT-2's 150 tensors launched 600 small kernels a step."""
    sq = torch.zeros(1, dtype=torch.float64, device=params[0].device if params else comm.device())
    dense: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            sq += squares(p.grad.coalesce()._values())
        else:
            g = local(p.grad)  # a sharded one: this rank's
            dense.setdefault(g.dtype, []).append(g)
    for dtype, grads in dense.items():
        norms = torch._foreach_norm(grads, 2, dtype=torch.promote_types(dtype, torch.float32))
        sq += torch.stack(norms).double().square().sum().to(sq.device)
    return sq


class StepTail:
    """``clip``: the max gradient norm (0: none). ``dp_group``: average gradients over it here (None: DDP already
    did in backward). ``tp``: the tensor-
    parallel handle (``finish_backward() -> squared norm``). ``tables``: sparse tables (``reduce``/``step``).
    ``norm_group``: the pipeline group whose stages' squared norms are summed for a global norm. ``shard_group``:
    the dp group FSDP shards the gradients over (each rank holds 1/dp of each: their squares are summed over it).
    ``tied``: see ``self.tied``. ``reduce_dtype`` (bf16, when asked): the dtype the dp average crosses in."""

    def __init__(self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, clip: float = 0.0, *,
                 dp_group=None, tp=None, tables=None, norm_group=None, tied=(), shard_group=None,
                 reduce_dtype: torch.dtype | None = None) -> None:
        self.params, self.optimizer, self.clip = params, optimizer, clip
        # (parameter, group, counted here): a weight several pipeline stages hold a copy of (a tied embedding);
        # their gradients are summed over the group, and the norm counts it on one of them
        self.tied = list(tied)
        self.uncounted = {id(p) for p, _, counted in self.tied if not counted}
        self.dp_group, self.tp, self.tables, self.norm_group = dp_group, tp, tables, norm_group
        self.shard_group, self.reduce_dtype = shard_group, reduce_dtype
        self.waited = 0.0  # seconds spent in the pipeline-wide norm all-reduce (waiting on other stages)

    def _sync_dp(self) -> None:
        # every parameter gets a gradient (zeros if unused) so all replicas all-reduce the same flat buffer
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        size = torch.distributed.get_world_size(self.dp_group)
        if size > 1 and grads:  # a stage of served tables only has nothing dense to average
            flat = _flatten_dense_tensors(grads)
            if self.reduce_dtype is None:
                comm.all_reduce(flat, "dp.dense", group=self.dp_group)
                flat /= size
            else:  # each rank's share rounded once; tessel.comm sums half-width terms in fp32 and rounds once
                low = flat.to(self.reduce_dtype).div_(size)
                comm.all_reduce(low, "dp.dense", group=self.dp_group)
                flat = low.to(flat.dtype)
            grads = _unflatten_dense_tensors(flat, grads)
        for p, g in zip(self.params, grads):
            p.grad = g

    def _sync_tied(self) -> None:
        for p, group, _ in self.tied:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            comm.all_reduce(p.grad, "pp.tied", group=group)

    def squared_norm(self, global_norm: bool = True, upto: int | None = None) -> torch.Tensor:
        if self.dp_group is not None:
            self._sync_dp()
        self._sync_tied()
        sq = (self.tp.finish_backward().reshape(1) if self.tp is not None
              else local_sq([p for p in self.params if id(p) not in self.uncounted]))
        if self.shard_group is not None:
            comm.all_reduce(sq, "meta", group=self.shard_group)
        if self.tables:
            with comm.guard("exchange of sparse row gradients", "sparse"):
                rows_sq = self.tables.reduce(upto)
            # a stage whose only layer is a served table has no parameter to put ``sq`` on the tables' device
            sq = sq.to(rows_sq.device) + rows_sq
        if global_norm and self.norm_group is not None:
            t0 = time.perf_counter()
            comm.all_reduce(sq, "meta", group=self.norm_group)
            self.waited += time.perf_counter() - t0
        return sq

    def __call__(self, lr: float, global_norm: bool = True, upto: int | None = None) -> float | torch.Tensor:
        """Finish the step at learning rate ``lr``; returns the gradient norm before clipping. ``upto``: the
        last mini-batch whose table rows this update takes (an asynchronous pipeline has later ones in flight).
        Where no sparse gradient or table needs the clip factor on the host, the norm stays a device tensor and
        the clip is a tensor too, so the host launches the update without waiting for the backward to finish (a
        GPU then never idles between backward and update)."""
        sq = self.squared_norm(global_norm, upto)
        set_lr(self.optimizer, lr)
        host = self.tables or any(p.grad is not None and p.grad.is_sparse for p in self.params)
        if host:
            norm = float(sq.sqrt())
            scale = clip_coef(norm, self.clip) if self.clip > 0 else 1.0  # a clip of 0: no clipping
            if scale < 1.0:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(scale)  # a loop, not _foreach: torch-sparse tables have sparse gradients
            if self.tables:
                # rows first: the next step's rows that waited for this update travel during the dense step
                self.tables.step(lr, scale)
        else:
            norm = sq.sqrt().reshape(())
            if self.clip > 0:  # clip_coef's rule in fp64 on the device: the same factor, bit for bit
                scale = (self.clip / (norm + 1e-6)).clamp(max=1.0)
                grads = [local(p.grad) for p in self.params if p.grad is not None]
                for device in {g.device for g in grads}:
                    torch._foreach_mul_([g for g in grads if g.device == device], scale.to(device))
        _as_laid_out([p for group in self.optimizer.param_groups if group.get("fused") for p in group["params"]])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def _as_laid_out(params) -> None:
    """Give each gradient its weight's memory layout. torch 2.13's fused CPU kernels walk a weight and its
    gradient as if laid out alike: a gradient whose strides differ from its weight's is stepped wrong (fused SGD,
    one step: off by up to 0.42 for a transposed gradient, 0.24 for a view of a larger buffer). 2-D tensor
    parallelism's gradients under torch's zero-bubble schedules are such (a 32 x 8 block at strides (1, 32), an
    8 x 8 at (1, 24)), and broke the fp64 parity of pp2 x tp4 2-D under torch-zbv; they are copied first."""
    for p in params:
        g = p.grad
        if g is not None and not g.is_sparse and g.stride() != p.stride():
            p.grad = torch.empty_like(p).copy_(g)
