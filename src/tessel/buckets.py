"""How DDP cuts a model's gradients into all-reduces: the bucket size tessel asks for, and how many DDP makes.

Each bucket is one all-reduce, and each all-reduce pays the ring's latency once, so the planner prices a DDP step
by this count; :func:`tessel.parallelize.apply_ddp` asks DDP for :func:`auto_mb`.
"""

from __future__ import annotations

from collections.abc import Iterable

TORCH_MB = 25.0  # DDP's default bucket_cap_mb


def auto_mb(total_bytes: float, buckets: int = 8) -> float:
    """A bucket size that cuts ``total_bytes`` of gradients into about ``buckets`` all-reduces.

    DDP's 25 MB default puts a model of a few tens of MB into one or two buckets, and a bucket is only sent
    when its last gradient exists, so nearly all traffic waits for the end of the backward pass. Smaller
    buckets start sending while the backward pass goes on; below ~1 MB per-collective latency dominates.

    >>> auto_mb(16 * 2**20)  # 16 MiB of gradients
    2.0
    """
    return float(min(TORCH_MB, max(1.0, round(total_bytes / 2**20 / buckets))))


def count(sizes: Iterable[float], bucket_mb: float) -> int:
    """All-reduces DDP makes of gradients of ``sizes`` bytes, given in the order they become ready (the model's
    parameters in reverse), once it has rebuilt its buckets after the first step: it fills a bucket until it holds
    at least the cap, so a parameter larger than the cap closes a bucket of its own. (Its smaller first bucket is
    only for a cap left to torch's default; tessel always names one.)

    >>> count([3 * 2**20, 2**19, 2**19, 2**19], bucket_mb=1.0)  # 3 MiB; then 0.5 + 0.5; then 0.5
    3
    """
    buckets, held = 0, 0.0
    for size in sizes:
        held += size
        if held >= bucket_mb * 2**20:
            buckets, held = buckets + 1, 0.0
    return buckets + (held > 0)
