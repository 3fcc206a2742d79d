"""What tensor parallelism costs per rank: bytes per Transformer block from the layout formulas, and a
projection of step time to clusters this machine cannot hold.

``block_bytes`` is exactly what the layers send on channel ``tp`` for one block (q/k/v as one h -> 3h
linear, out_proj h -> h, fc_in h -> f, fc_out f -> h); the tests hold the layers to it.

    >>> block_bytes("3d", (2, 2, 2), m=1024, h=256, f=1024, elem=4)
    4980736
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


# ---- projection to a cluster this machine cannot hold -------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """A GPU cluster for the projection; defaults: TACC-like V100 nodes (the 3-D paper's 64 GPUs)."""

    gpus_per_node: int = 4
    nvlink_gbs: float = 75.0  # GB/s between GPUs of a node (V100 NVLink2, 3 links x 25 GB/s)
    nic_gbs: float = 12.5  # GB/s per node (InfiniBand EDR, 100 Gbit/s), shared by the node's GPUs
    flops: float = 50e12  # sustained fp16 GEMM FLOP/s per GPU (40% of the V100's 125 TFLOP/s)
    alpha: float = 10e-6  # seconds per ring step of a collective
    elem: int = 2  # bytes per element (fp16)


def _group_gbs(c: Cluster, size: int, stride: int) -> float:
    """Ring bandwidth of a group of ``size`` ranks ``stride`` apart (ranks fill nodes in order)."""
    if size * stride <= c.gpus_per_node or size == 1:
        return c.nvlink_gbs
    # every GPU of a node that is in a different group of this kind sends across the NIC at the same time
    sharing = min(stride, c.gpus_per_node)
    return c.nic_gbs / sharing


def _strides(mode: str, shape: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    """axis -> (size, stride): the mesh's last axis holds consecutive ranks."""
    out, stride = {}, 1
    for name, size in reversed(list(zip(AXES[mode], shape))):
        out[name] = (size, stride)
        stride *= size
    return out


def project_block(mode: str, shape: tuple[int, ...], m: int, h: int, f: int, c: Cluster = Cluster(),
                  seq: int = 2048) -> dict[str, float]:
    """Seconds per Transformer block (forward + backward) on ``c``: compute, communication and their sum
    (no overlap assumed, as in the layers here)."""
    p = math.prod(shape)
    axes = _strides(mode, shape)
    gemm = sum(6 * m * a * b for a, b in [(h, 3 * h), (h, h), (h, f), (f, h)]) + 12 * m * seq * h  # + attention
    compute = gemm / p / c.flops
    comm_s = 0.0
    for a, b, up in [(h, 3 * h, True), (h, h, False), (h, f, True), (f, h, False)]:
        if mode == "1d":
            size, stride = axes["tp"]
            n = m * (a if up else b)
            comm_s += 2 * (size - 1) / size * n * c.elem / (_group_gbs(c, size, stride) * 1e9)
            comm_s += 2 * (size - 1) * c.alpha
            continue
        spec = plan_for(mode).up if up else plan_for(mode).down
        for axis, elems in [(spec.x_gather, m * a), (spec.w_gather, a * b), (spec.reduce_scatter, m * b)]:
            size, stride = axes.get(axis, (1, 1))
            if size > 1:  # forward collective and its backward partner: (size-1)/P of the tensor each
                comm_s += 2 * (size - 1) * elems / p * c.elem / (_group_gbs(c, size, stride) * 1e9)
                comm_s += 2 * (size - 1) * c.alpha
    return {"compute": compute, "comm": comm_s, "total": compute + comm_s}


def projection_markdown(h: int = 8192, seq: int = 2048, batches=(8, 32), c: Cluster = Cluster()) -> str:
    """The cost model at 64 GPUs for a GPT-style block (hidden h, MLP 4h), 1-D vs 2-D vs 3-D."""
    grids = [("1d", (64,)), ("2d", (8, 8)), ("3d", (4, 4, 4))]
    lines = [f"| batch (sequences of {seq}) | mode | grid | compute ms | comm ms | block ms | 3-D speed-up |",
             "|---|---|---|---|---|---|---|"]
    for b in batches:
        res = {mode: project_block(mode, shape, b * seq, h, 4 * h, c, seq) for mode, shape in grids}
        for mode, shape in grids:
            r = res[mode]
            lines.append(f"| {b} | {mode} | {'x'.join(map(str, shape))} | {r['compute'] * 1e3:.1f} | "
                         f"{r['comm'] * 1e3:.1f} | {r['total'] * 1e3:.1f} | "
                         f"{r['total'] / res['3d']['total']:.2f}x |")
    return "\n".join(lines) + "\n"
