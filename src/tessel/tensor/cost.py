"""What tensor parallelism costs per rank: bytes per Transformer block from the layout formulas, and a
projection of step time to clusters this machine cannot hold.

``block_bytes`` is exactly what the layers send on channel ``tp`` for one block (q/k/v as one h -> 3h
linear, out_proj h -> h, fc_in h -> f, fc_out f -> h); the tests hold the layers to it.

    >>> block_bytes("3d", (2, 2, 2), m=1024, h=256, f=1024, elem=4)
    4980736
"""

from __future__ import annotations

from .grid import AXES
from .layout import plan_for


def linear_elems(mode: str, shape: tuple[int, ...], m: int, h: int, h2: int, up: bool, regather: bool = False) -> float:
    """Elements one rank sends for one linear (forward + backward): M rows, h -> h2 features."""
    p = 1
    for s in shape:
        p *= s
    if mode in ("1d", "torch-1d"):
        return 2 * (p - 1) / p * m * (h if up else h2)  # column: dX all-reduce; row: Y all-reduce
    spec = plan_for(mode).up if up else plan_for(mode).down
    size = dict(zip(AXES[mode], shape))
    s, z, r = (size.get(a, 1) for a in (spec.x_gather, spec.w_gather, spec.reduce_scatter))
    gathers = (s - 1) * m * h + (z - 1) * h * h2
    return (2 * gathers + 2 * (r - 1) * m * h2 + (gathers if regather else 0)) / p


def block_bytes(mode: str, shape: tuple[int, ...], m: int, h: int, f: int, elem: int = 4,
                regather: bool = False) -> int:
    """Bytes one rank sends on channel ``tp`` for one block (torch-1d: what its six linears would send if
    q, k and v shared one all-reduce, as tessel's 1-D does; torch's own does three)."""
    parts = [(h, 3 * h, True), (h, h, False), (h, f, True), (f, h, False)]
    return int(round(sum(linear_elems(mode, shape, m, a, b, up, regather) for a, b, up in parts) * elem))
