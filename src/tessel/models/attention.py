"""Causal attention's core, computed at the width the device runs it fastest under mixed precision.

Under CPU autocast to a 16-bit dtype, torch's CPU flash attention ran 3.4x slower in bf16 than in fp32 at head width
32 (18.6 against 5.8 ms forward and backward, one thread) and within 8% either way at heads 64-128 wide
(docs/benchmarks.md, "Mixed precision"). So on CPU it computes in fp32: q, k and v, rounded to autocast's dtype as
autocast would round them for the op, widen exactly, and the output is rounded back to autocast's dtype, which the
next product would round it to anyway. Other devices keep autocast's choice. The rule reads only the autocast state,
which activation recompute restores, so a recomputed forward computes the way the first one did.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q kᵀ / √hd, causal) v: (B, H, T, hd) each -> (B, H, T, hd), in autocast's dtype where widened."""
    if not _widened(q):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    low = torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", enabled=False):
        # rounded to autocast's dtype first, as autocast would hand them to the op (a no-op for its products'
        # outputs, which they are in tessel's models), then widened exactly
        q, k, v = (t.to(low).float() for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return y.to(low)


def _widened(q: torch.Tensor) -> bool:
    """Whether this call computes in fp32 instead of autocast's 16-bit dtype (CPU autocast to bf16 or fp16)."""
    return (q.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16))
