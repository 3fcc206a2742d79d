"""A language model's output layer: hidden states -> vocabulary logits, and, given targets, their mean
cross-entropy computed a block of rows at a time, so the (rows, vocab) logits never exist whole.

Why: at a language model's usual shapes the head and its loss are a large part of a step. Unfused, the default
model (2048 rows, 8192 words) streams its 64 MiB of fp32 logits through memory five or more times a step: the
log-softmax, its backward, the zero-filled gradient of the picked entries, and under bf16-mixed two casts. Here
each block of logits stays in cache: its softmax gradient (softmax - one-hot) is made in place and multiplied
straight into the hidden states' and the weight's gradients during the forward, as Liger Kernel's fused linear
cross-entropy does, so the backward only scales them by the incoming gradient. Same value as
``F.cross_entropy(F.linear(h, weight, bias), targets)`` (ignore_index -100 included); the products run in the
autocast dtype where autocast is on (the weight cast once per call), the softmax and every sum in fp32 (fp64 in
fp64 runs). The cost: the weight's gradient is held from the forward to the backward.

Example::

    >>> import torch
    >>> import torch.nn.functional as F
    >>> head = VocabHead(8, 50).double()
    >>> h, t = torch.randn(6, 8, dtype=torch.float64), torch.tensor([1, 4, 9, 49, 0, -100])
    >>> bool(torch.allclose(head(h, t), F.cross_entropy(head(h), t)))
    True
"""

import torch
from torch import nn
from torch.autograd.function import once_differentiable

IGNORE = -100  # F.cross_entropy's default ignore_index: such rows add no loss and no gradient

# Elements of logits per block, chosen, not tuned. CPU: 2M (8 MiB in fp32), near a server core's L2 + L3 share; on the
# default model 1M-, 2M- and 4M-element blocks gave steps within about 10% of each other (one plain-loop run each).
# Accelerators run each block as a few kernels, so fewer, larger blocks (not yet run on one).
_BLOCK = {"cpu": 1 << 21}
_BLOCK_OTHER = 1 << 26


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    kind = h.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype


def _block(x, t, ok, wc, bc, z, low, want):
    """One block of rows: (its loss sum, the gradient of that sum w.r.t. its logits, in ``z``, or None).
    x (r, D) in the compute dtype, t (r, 1) targets (ignored rows: any word), ok (r,) the counted rows; z (r, V)
    in fp32 (fp64 in fp64 runs) and ``low`` (r, V) in the compute dtype where that is narrower: buffers reused."""
    if low is None:
        torch.mm(x, wc.T, out=z)
    else:  # the product in the compute dtype, widened for the softmax
        z.copy_(torch.mm(x, wc.T, out=low))
    if bc is not None:
        z += bc
    picked = z.gather(1, t).squeeze(1)
    top = z.amax(1, keepdim=True)
    z.sub_(top).exp_()  # in place (torch.logsumexp would make a block-sized temporary)
    sums = z.sum(1, keepdim=True)
    loss = ((top + sums.log()).squeeze(1) - picked).mul_(ok).sum()  # log-sum-exp minus the target's logit
    if not want:
        return loss, None
    z.div_(sums)  # the softmax
    z.scatter_add_(1, t, -ok.to(z.dtype)[:, None])  # minus one at each counted row's target
    return loss, z.mul_(ok[:, None])  # ignored rows: no gradient


def _blocks(h, weight, bias, targets, compute, grads):
    """(sum of the rows' losses, rows counted, grad_h, grad_weight, grad_bias) for the unscaled sum; a gradient
    is None where ``grads`` (h, weight, bias) says it is not wanted. h (N, D), weight (V, D), targets (N,)."""
    acc = torch.promote_types(compute, torch.float32)
    hc, wc = h.to(compute), weight.to(compute)
    bc = bias.to(acc) if bias is not None else None
    (n, _), vocab = h.shape, weight.shape[0]
    valid = targets != IGNORE
    gh = torch.empty_like(hc) if grads[0] else None
    gw = torch.zeros(weight.shape, dtype=acc, device=h.device) if grads[1] else None
    gb = torch.zeros(vocab, dtype=acc, device=h.device) if grads[2] else None
    total = torch.zeros((), dtype=acc, device=h.device)
    rows = min(n, max(1, _BLOCK.get(h.device.type, _BLOCK_OTHER) // vocab))
    # one set of block buffers per call: fresh large tensors per block cost a page fault per page each time
    z = torch.empty(rows, vocab, dtype=acc, device=h.device)
    low = torch.empty(rows, vocab, dtype=compute, device=h.device) if compute != acc else None
    for lo in range(0, n, rows):
        r = min(rows, n - lo)
        x, ok = hc[lo:lo + r], valid[lo:lo + r]
        t = targets[lo:lo + r].clamp(min=0)[:, None]  # an ignored row picks word 0; ok masks it out
        loss, dz = _block(x, t, ok, wc, bc, z[:r], None if low is None else low[:r], any(grads))
        total += loss
        if dz is None:
            continue
        if gb is not None:
            gb += dz.sum(0)
        g = dz if low is None else low[:r].copy_(dz)  # the gradient in the compute dtype
        if gh is not None:
            torch.mm(g, wc, out=gh[lo:lo + r])
        if gw is not None and low is None:  # summed in place: no weight-sized temporary
            gw.addmm_(g.T, x)
        elif gw is not None:  # (bf16 products) each block's product rounded to the compute dtype once, summed in fp32
            gw += g.T @ x
    return total, valid.sum(), gh, gw, gb


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, targets, compute):
        with torch.autocast(h.device.type, enabled=False):  # the dtypes are chosen above, explicitly
            total, count, gh, gw, gb = _blocks(h, weight, bias, targets, compute, ctx.needs_input_grad[:3])
        ctx.save_for_backward(gh, gw, gb, count)
        ctx.dtypes = h.dtype, weight.dtype, bias.dtype if bias is not None else None
        return total / count

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        gh, gw, gb, count = ctx.saved_tensors
        scale = grad / count
        # scaled in place where the dtype allows (the saved gradients are not read again): no second weight-sized copy
        out = [None if g is None else g.mul_(scale) if g.dtype == d else (g.to(scale.dtype) * scale).to(d)
               for g, d in zip((gh, gw, gb), ctx.dtypes)]
        return *out, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``F.linear(h, weight, bias)`` (h (N, D), weight (V, D)) against ``targets`` (N,)."""
    compute = _compute_dtype(h)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, bias)):
        return _FusedLinearCrossEntropy.apply(h, weight, bias, targets, compute)
    with torch.autocast(h.device.type, enabled=False):
        total, count, *_ = _blocks(h, weight, bias, targets, compute, (False, False, False))
    return total / count


class VocabHead(nn.Linear):
    """``nn.Linear(dim, vocab)`` whose call with targets returns the mean loss without making the logits whole.

    h (..., dim) -> logits (..., vocab); ``head(h, targets)`` with targets (...) -> the scalar mean loss."""

    def forward(self, h: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return super().forward(h)
        return linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.weight, self.bias, targets.reshape(-1))
