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

from ..choices import tensor_mode
from .layout import plan_for


def linear_traffic(mode: str, shape: tuple[int, ...], m: int, h: int, h2: int, up: bool,
                   regather: bool = False, input_grad: bool = True, live: bool = False, recompute: bool = False,
                   ends: bool = False) -> list[tuple[str, float, int, int]]:
    """(grid axis, elements one rank sends over it, ring steps, calls) for one linear, forward + backward:
    M rows, h -> h2 features. The formulas of :mod:`tessel.tensor.layout`. ``input_grad=False``: the input is
    data (a model's first linear), so no gradient of it is reduced. ``live``: the backward gathers the weight
    again (asynchronous schedules whose backward reads newer weights, see tessel.tensor.ops.matmul).
    ``recompute``: the layer's forward runs again in its backward, its collectives with it, except the output's
    sum of a linear that ``ends`` its layer: torch's recompute stops once the last tensor saved for backward is
    back, and nothing after that linear saves one."""
    p, mode = math.prod(shape), tensor_mode(mode)
    again, out_again = int(recompute), int(recompute and not ends)
    spec = plan_for(mode).up if up else plan_for(mode).down
    if spec.summed:  # 1-D: column linears all-reduce dX (backward), row linears Y (forward: the output's sum)
        if up and not input_grad:
            return []
        times = 1 if up else 1 + out_again
        return [(spec.summed, times * 2 * (p - 1) / p * m * (h if up else h2), times * 2 * (p - 1), times)]
    size = dict(zip(mode.axes, shape))
    gathered = 3 if regather else 2  # forward gather and its backward reduce-scatter, plus the re-gather
    w_gathered = 3 if regather or live else 2
    out = []
    for axis, elems, times in [(spec.x_gather, m * h, gathered - (not input_grad) + again),
                               (spec.w_gather, h * h2, w_gathered + again),
                               (spec.reduce_scatter, m * h2, 2 + out_again)]:
        q = size.get(axis, 1)
        if q > 1:  # each collective moves (q-1)/P of the full tensor per rank
            out.append((axis, times * (q - 1) * elems / p, times * (q - 1), times))
    return out


def _count(sizes: dict[str, int], axes) -> int:
    return math.prod(sizes.get(a, 1) for a in axes)


def _ring(q: int, n: float) -> float:
    return 2 * (q - 1) / q * n


def embedding_traffic(spec, sizes: dict[str, int], weight: int, dim: int, rows: int, recompute: bool = False
                      ) -> list[tuple[str, float, int, int]]:
    """(grid axis, elements one rank sends, ring steps, calls) of the token table per micro-batch of ``rows`` tokens
    (the dp rank's whole micro-batch), forward + backward: the vocabulary shard of ``weight`` elements gathered
    and its gradient reduce-scattered back; the looked-up block (``dim`` features per token) reduce-scattered
    (3-D) or all-reduced (1-D, no backward: the output feeds replicated work). ``recompute``: the forward's
    collectives run again in the backward."""
    out, again = [], int(recompute)
    q = sizes.get(spec.w_gather, 1)
    if q > 1:
        out.append((spec.w_gather, (2 + again) * (q - 1) * weight, (2 + again) * (q - 1), 2 + again))
    looked_up = rows / _count(sizes, spec.ids_rows) * dim
    q = sizes.get(spec.reduce_scatter, 1)
    if q > 1:
        out.append((spec.reduce_scatter, (2 + again) * (q - 1) * looked_up / q, (2 + again) * (q - 1), 2 + again))
    q = sizes.get(spec.all_reduce, 1)
    if q > 1:
        out.append((spec.all_reduce, (1 + again) * _ring(q, looked_up), (1 + again) * 2 * (q - 1), 1 + again))
    return out


def norm_traffic(layout, sizes: dict[str, int], rows: int, recompute: bool = False
                 ) -> list[tuple[str, float, int, int]]:
    """A LayerNorm over features cut by ``layout.cols``: per row its sum and sum of squares all-reduced forward
    (again in the backward where the layer is recomputed), and two sums of the gradient backward (``rows``: the
    dp rank's micro-batch tokens, before the row cut)."""
    q = sizes.get(layout.cols, 1)
    if q == 1:
        return []
    local, times = rows / _count(sizes, layout.rows), 2 + int(recompute)
    return [(layout.cols, times * _ring(q, 2 * local), times * 2 * (q - 1), times)]


def loss_traffic(layout, sizes: dict[str, int], rows: int) -> list[tuple[str, float, int, int]]:
    """Megatron's vocabulary-parallel cross-entropy on logits in ``layout``, forward only (its backward is
    local, and recompute runs the chain's layers again, never the loss): each row's max, then its sum of
    exponentials and target logit, over the vocabulary axis; the loss summed once over each axis that cuts the
    rows."""
    out = []
    q = sizes.get(layout.cols, 1)
    if q > 1:
        local = rows / _count(sizes, layout.rows)
        out.append((layout.cols, _ring(q, local) + _ring(q, 2 * local), 4 * (q - 1), 2))
    out += [(a, _ring(sizes[a], 1), 2 * (sizes[a] - 1), 1) for a in layout.rows if sizes.get(a, 1) > 1]
    return out


def grad_sum_traffic(partial: dict[tuple[str, ...], int], sizes: dict[str, int]
                     ) -> list[tuple[str, float, int, int]]:
    """Per step: the gradients of pieces replicated over row-cut axes (``partial``: their axes -> elements on
    this rank) summed over each of those axes in turn (tessel.tensor.TensorParallel.reduce_grads)."""
    return [(a, _ring(sizes[a], n), 2 * (sizes[a] - 1), 1) for axes, n in partial.items() for a in axes
            if sizes.get(a, 1) > 1 and n]


def norm_sum_traffic(sizes: dict[str, int]) -> list[tuple[str, float, int, int]]:
    """Per step: the squared gradient norm (one fp64 element, whatever the training dtype) summed over every
    grid axis; elements here are fp64 ones."""
    return [(a, _ring(q, 1), 2 * (q - 1), 1) for a, q in sizes.items() if q > 1]


def _block(h: int, f: int) -> list[tuple[int, int, bool]]:
    """(features in, features out, up) of a block's linears: q/k/v as one, out_proj, fc_in, fc_out."""
    return [(h, 3 * h, True), (h, h, False), (h, f, True), (f, h, False)]


def step_formula(cfg, plan, elem: int) -> dict:
    """What a run's Transformer blocks should send on channel ``tp`` per rank and step under ``plan`` (written into
    its summary; ``cfg``: the run's config, for the model's widths; ``elem``: bytes per element on the wire, 2 where
    bf16-mixed sends the activations and partial sums in bf16)."""
    rows = cfg.train.global_batch // (plan.dp * plan.micro_batches) * cfg.data.seq_len
    per_block = block_bytes(plan.tp_mode, plan.tp_grid, rows, cfg.model.dim, cfg.model.hidden or 4 * cfg.model.dim,
                            elem, plan.regather, plan.recompute.layers)
    return {"layers": cfg.model.layers, "block_bytes_per_micro_batch": per_block,
            "tp_bytes_per_step": per_block * cfg.model.layers * plan.micro_batches}


def block_bytes(mode: str, shape: tuple[int, ...], m: int, h: int, f: int, elem: int = 4,
                regather: bool = False, recompute: bool = False) -> int:
    """Bytes one rank sends on channel ``tp`` for one block (torch-1d: what its six linears would send if
    q, k and v shared one all-reduce, as tessel's 1-D does; torch's own does three)."""
    linears = _block(h, f)  # fc_out, the last, ends the block (transformer_linears)
    return int(round(sum(e for j, (a, b, up) in enumerate(linears) for _, e, _, _ in
                         linear_traffic(mode, shape, m, a, b, up, regather, recompute=recompute,
                                        ends=j + 1 == len(linears))) * elem))


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
    for name, size in reversed(list(zip(tensor_mode(mode).axes, shape))):
        out[name] = (size, stride)
        stride *= size
    return out


def project_block(mode: str, shape: tuple[int, ...], m: int, h: int, f: int, c: Cluster = Cluster(),
                  seq: int = 2048) -> dict[str, float]:
    """Seconds per Transformer block (forward + backward) on ``c``: compute, communication and their sum
    (no overlap assumed, as in the layers here)."""
    p = math.prod(shape)
    axes = _strides(mode, shape)
    linears = _block(h, f)
    gemm = sum(6 * m * a * b for a, b, _ in linears) + 12 * m * seq * h  # + attention scores
    compute = gemm / p / c.flops
    comm_s = 0.0
    for a, b, up in linears:
        for axis, elems, steps, _ in linear_traffic(mode, shape, m, a, b, up):
            comm_s += elems * c.elem / (_group_gbs(c, *axes[axis]) * 1e9) + steps * c.alpha
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
