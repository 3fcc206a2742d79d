"""Differentiable collectives on grid axes, and the one sharded matmul every tensor-parallel linear uses.

Each op is its own adjoint's partner: all-gather forward is reduce-scatter backward and the reverse; an
all-reduce whose result feeds replicated work has an identity backward (Megatron's ``g``), one whose result
feeds sharded work all-reduces its gradient too; ``copy`` is identity forward, all-reduce backward
(Megatron's ``f``). Every byte goes through :mod:`tessel.comm` on channel ``tp``. A ``None`` group (an
axis of one rank) makes every op the identity, so 2x2x1 grids cost nothing on their unit axis.

:func:`matmul` is ``gather(x) @ gather(w).T`` with the gathers' adjoints in backward. With
``regather=True`` it keeps only the shards for backward and gathers again there: activation memory
stays 1/P of the layer's, at the price of the two gathers repeated (the memory Colossal-AI's users found
2-D/3-D spending, hpcaitech/ColossalAI#499).

Widths under mixed precision (autocast on): a GEMM's inputs are cast to autocast's dtype before they are gathered
(activations and weights cross in bf16: half the bytes), and what a bf16 GEMM gives (its output's partial sums,
dX, dW) crosses in bf16 too: it was rounded to bf16 when computed, so the wire rounds nothing more. Every sum
accumulates in fp32 wherever its terms cross (:func:`tessel.comm.reduce_scatter`, :func:`tessel.comm.all_reduce`
of a half-width tensor) and is rounded once to the terms' width, as one bf16 GEMM's output would be; fp32 tensors
(gradients of the fp32 parameters, norm statistics, the loss) cross in fp32.
"""

from __future__ import annotations

import contextlib

import torch

from .. import comm

CHANNEL = "tp"  # the blocks' linears; norms, embedding, head and gradient sums get channels of their own
_channel = [CHANNEL]


@contextlib.contextmanager
def channel(name: str):
    """Count the collectives of ops started (forward) inside, and of their backward, on ``name``."""
    _channel.append(name)
    try:
        yield
    finally:
        _channel.pop()


def current() -> str:
    return _channel[-1]


def _size(group) -> int:
    return 1 if group is None else comm.group_size(group)


def wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the dtype it is gathered in: autocast's where autocast is on (mixed precision), else its own."""
    dev = t.device.type
    if t.is_floating_point() and torch.is_autocast_enabled(dev):
        return t.to(torch.get_autocast_dtype(dev))
    return t


def exact(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32 where it is half-width: what the loss and norm statistics are computed in."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def start_gather(x: torch.Tensor, group, dim: int, channel: str | None = None):
    """Begin concatenating every rank's ``x`` along ``dim`` in group-rank order; call the result for it."""
    p = _size(group)
    if p == 1:
        return lambda: x
    moved = wire(x).movedim(dim, 0).contiguous()
    out = moved.new_empty((p * moved.shape[0], *moved.shape[1:]))
    work = comm.all_gather_into(out, moved, channel or current(), group=group, async_op=True)
    return lambda: (work.wait(), out.movedim(0, dim))[1]


def start_reduce_scatter(x: torch.Tensor, group, dim: int, channel: str | None = None):
    """Begin summing ``x`` over the group, keeping this rank's 1/P block of ``dim``; call the result for it."""
    p = _size(group)
    if p == 1:
        return lambda: x
    moved = x.movedim(dim, 0).contiguous()
    if moved.shape[0] % p:
        raise ValueError(f"reduce_scatter of dim {dim} with {moved.shape[0]} rows over {p} ranks")
    # the terms cross in their own width; the sum accumulates in fp32 and is rounded once to that width again
    out = moved.new_empty((moved.shape[0] // p, *moved.shape[1:]), dtype=exact(moved[:0]).dtype)
    work = comm.reduce_scatter(out, moved, channel or current(), group=group, async_op=True)
    return lambda: (work.wait(), out.to(x.dtype).movedim(0, dim))[1]


def gather_raw(x: torch.Tensor, group, dim: int, channel: str | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in group-rank order (no autograd)."""
    return start_gather(x, group, dim, channel)()


def reduce_scatter_raw(x: torch.Tensor, group, dim: int, channel: str | None = None) -> torch.Tensor:
    """Sum ``x`` over the group and keep this rank's 1/P block of ``dim`` (no autograd)."""
    return start_reduce_scatter(x, group, dim, channel)()


def all_reduce_raw(x: torch.Tensor, group, channel: str | None = None) -> torch.Tensor:
    if _size(group) == 1:
        return x
    out = x.contiguous().clone()
    comm.all_reduce(out, channel or current(), group=group)
    return out


class _Adjoint(torch.autograd.Function):
    """``forward(x, *args)`` with ``backward(dy, *args)`` as its gradient: the collective pairs below."""

    @staticmethod
    def forward(ctx, x, forward, backward, *args):
        ctx.backward_fn, ctx.args, ctx.channel = backward, args, current()
        return forward(x, *args)

    @staticmethod
    def backward(ctx, dy):
        with channel(ctx.channel):
            return ctx.backward_fn(dy, *ctx.args), None, None, *(None for _ in ctx.args)


def _identity(x, *args):
    return x


def gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    return x if group is None else _Adjoint.apply(x, gather_raw, reduce_scatter_raw, group, dim)


def reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    return x if group is None else _Adjoint.apply(x, reduce_scatter_raw, gather_raw, group, dim)


def all_reduce(x: torch.Tensor, group, grad_sum: bool = False) -> torch.Tensor:
    """Sum over the group. ``grad_sum``: the result feeds sharded work, so its gradient is summed too."""
    return x if group is None else _Adjoint.apply(x, all_reduce_raw, all_reduce_raw if grad_sum else _identity, group)


def copy(x: torch.Tensor, group) -> torch.Tensor:
    """Identity; the gradient is summed over the group (the input feeds column-split work)."""
    return x if group is None else _Adjoint.apply(x, _identity, all_reduce_raw, group)


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, x_group, x_dim, w_group, w_dim, regather, live, *ws):
        # in the compute dtype before the gathers (mixed precision: half the bytes, the GEMM's own inputs)
        x, w = wire(x), wire(ws[0] if len(ws) == 1 else torch.cat(ws))  # q, k, v side by side
        # the two gathers run on different groups at once
        xa, wa = start_gather(x, x_group, x_dim), start_gather(w, w_group, w_dim)
        xa, wa = xa(), wa()
        ctx.args, ctx.channel = (x_group, x_dim, w_group, w_dim, regather, live, len(ws)), current()
        ctx.rows, ctx.wire = [t.shape[0] for t in ws], w.dtype
        # live: keep the weight tensors the forward was given, not their concatenation or gathered copy, so the
        # backward reads them as they are then (an optimizer update in between, or weights predicted again)
        ctx.save_for_backward(x if regather else xa, *(ws if regather or live else (wa,)))
        return torch.matmul(xa, wa.t())

    @staticmethod
    def backward(ctx, dy):
        x_group, x_dim, w_group, w_dim, regather, live, n = ctx.args
        xa, *ws = ctx.saved_tensors
        c = ctx.channel
        if regather or live:
            w = (ws[0] if len(ws) == 1 else torch.cat(ws)).to(ctx.wire)  # gathered as the forward did
            wa = start_gather(w, w_group, w_dim, c)
            if regather:
                xa = start_gather(xa, x_group, x_dim, c)()
            wa = wa()
        else:
            wa = ws[0]
        dx = dw = None
        # dX's reduce-scatter travels while dW is computed (Colossal-AI's async gradient reduce-scatter)
        if ctx.needs_input_grad[0]:
            dx = start_reduce_scatter(torch.matmul(dy, wa), x_group, x_dim, c)
        if any(ctx.needs_input_grad[7:]):
            dwa = dy.reshape(-1, dy.shape[-1]).t() @ xa.reshape(-1, xa.shape[-1])
            dw = start_reduce_scatter(dwa, w_group, w_dim, c)
        dws = dw().split(ctx.rows) if dw is not None else (None,) * n
        return (dx and dx(), None, None, None, None, None, None, *dws)


def matmul(x: torch.Tensor, w: torch.Tensor | list[torch.Tensor], x_group=None, x_dim: int = 0, w_group=None,
           w_dim: int = 1, regather: bool = False, live: bool = False) -> torch.Tensor:
    """``gather(x, x_group, x_dim) @ gather(w, w_group, w_dim).T`` (w in nn.Linear's [out, in] layout; a list of
    weights that share the input is concatenated by output rows, as q, k and v are).

    Backward reduce-scatters dX over ``x_group`` and dW over ``w_group``: each is a partial sum there.
    ``live``: the backward concatenates and gathers the weights again from the tensors the forward was given,
    as they are by then (asynchronous pipelines whose backward reads newer weights than their forward: the
    gather's bytes are sent twice).
    """
    ws = list(w) if isinstance(w, (list, tuple)) else [w]
    return _Matmul.apply(x, x_group, x_dim, w_group, w_dim, regather, live, *ws)
