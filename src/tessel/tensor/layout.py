"""Explicit layouts: what each tensor-parallel layer takes and gives, per mode, checked when layers are joined.

A :class:`Layout` says which grid axes cut an activation's batch dim (major first) and which axis cuts its
feature dim. Every layer spec names its input and output layout; :func:`check_chain` refuses a model whose
consecutive layers disagree, so nothing depends on the order layers were built in (Colossal-AI's 3-D
swapped a global input/output role at each construction, which broke models built in another order).

The transformer's plan per mode (R: the residual stream's layout)::

    1d  R = whole                 column linear: R -> cols/tp (input copied), row linear: cols/tp -> R (all-reduce)
    2d  R = rows/r cols/c         every linear R -> R: gather x over c (cols), gather W over r, local GEMM
    3d  R = rows/z.x cols/y       L(y,x): R -> T = rows/z.y cols/x: gather x over x (rows), W over z, GEMM,
                                  reduce-scatter over y (rows); L(x,y): T -> R with x and y swapped

Bytes one rank moves per linear (forward + backward, M rows, h -> h' features, fp bytes b)::

    1d  2(P-1)/P * M*h' * b                                 (one all-reduce: forward for row, backward for column)
    2d  2[(c-1) M*h + (r-1) h*h'] / (r*c) * b               (gather x + its reduce-scatter, gather W + its rs)
    3d  2[(s-1) M*h + (z-1) h*h' + (r-1) M*h'] / (x*y*z) * b   for L(r,s); 2(q-1)(M*h + M*h' + h*h')/q^3 on a cube
"""

from __future__ import annotations

from dataclasses import dataclass

from ..choices import tensor_mode
from ..errors import PlanError
from .grid import Split


@dataclass(frozen=True)
class Layout:
    rows: tuple[str, ...] = ()  # axes cutting the batch dim, major first
    cols: str | None = None  # axis cutting the feature dim

    def __str__(self) -> str:
        return f"rows/{'.'.join(self.rows) or '-'} cols/{self.cols or '-'}"


@dataclass(frozen=True)
class LinearSpec:
    inp: Layout
    out: Layout
    weight: Split  # of nn.Linear's [out, in] weight
    x_gather: str | None = None  # axis x is gathered over before the GEMM ...
    x_dim: int = 0  # ... along this dim (0: batch rows, -1: features)
    w_gather: str | None = None  # axis the weight's in-dim is gathered over
    copy: str | None = None  # 1-D column: x is whole here, its gradient is summed over this axis
    reduce_scatter: str | None = None  # the GEMM's partial sums are reduce-scattered over this axis (batch dim)
    all_reduce: str | None = None  # ... or all-reduced (1-D row)

    @property
    def bias(self) -> Split:
        return Split.of(d0=self.out.cols) if self.out.cols else Split()

    @property
    def summed(self) -> str | None:
        """1-D (Megatron): the one axis a whole activation or its gradient is all-reduced over, else None."""
        return self.copy or self.all_reduce


@dataclass(frozen=True)
class EmbeddingSpec:
    out: Layout
    weight: Split  # of the [vocab, dim] table
    w_gather: str | None = None  # axis the vocab dim is gathered over
    vocab: str | None = None  # after the gather, this axis still splits the vocabulary (masked lookup)
    ids_rows: tuple[str, ...] = ()  # axes cutting the batch of ids this rank looks up
    reduce_scatter: str | None = None
    all_reduce: str | None = None


@dataclass(frozen=True)
class Plan:
    mode: str
    residual: Layout
    up: LinearSpec  # q/k/v, fc_in, head: the residual stream into a split hidden
    down: LinearSpec  # out_proj, fc_out: back to the residual stream
    embedding: EmbeddingSpec

    def check(self) -> None:
        check_chain([("embedding", None, self.embedding.out), ("ln", self.residual, self.residual),
                     ("attn.qkv", self.up.inp, self.up.out), ("attn.out_proj", self.down.inp, self.down.out),
                     ("mlp.fc_in", self.up.inp, self.up.out), ("mlp.fc_out", self.down.inp, self.down.out)])
        if self.down.out != self.residual:
            raise PlanError(f"{self.mode}: a block ends in {self.down.out}, not the residual layout {self.residual}")


def check_chain(layers: list[tuple[str, Layout | None, Layout]]) -> None:
    """Each layer's input layout must be the previous layer's output layout."""
    for (prev, _, out), (name, inp, _) in zip(layers, layers[1:]):
        if inp is not None and inp != out:
            raise PlanError(f"layer '{name}' expects input layout {inp} but '{prev}' gives {out}; "
                            "join layers whose layouts match (see tessel.tensor.layout)")


def _one_d() -> Plan:
    whole, split = Layout(), Layout(cols="tp")
    return Plan("1d", whole,
                up=LinearSpec(whole, split, Split.of(d0="tp"), copy="tp"),
                down=LinearSpec(split, whole, Split.of(d1="tp"), all_reduce="tp"),
                embedding=EmbeddingSpec(whole, Split.of(d0="tp"), vocab="tp", all_reduce="tp"))


def _two_d() -> Plan:
    r = Layout(rows=("tp_r",), cols="tp_c")
    lin = LinearSpec(r, r, Split.of(d0="tp_c", d1="tp_r"), x_gather="tp_c", x_dim=-1, w_gather="tp_r")
    return Plan("2d", r, up=lin, down=lin,
                embedding=EmbeddingSpec(r, Split.of(d0="tp_r", d1="tp_c"), w_gather="tp_r", ids_rows=("tp_r",)))


def _three_d() -> Plan:
    r, t = Layout(rows=("tp_z", "tp_x"), cols="tp_y"), Layout(rows=("tp_z", "tp_y"), cols="tp_x")
    return Plan("3d", r,
                up=LinearSpec(r, t, Split.of(d0="tp_x", d1=("tp_y", "tp_z")), x_gather="tp_x", w_gather="tp_z",
                              reduce_scatter="tp_y"),
                down=LinearSpec(t, r, Split.of(d0="tp_y", d1=("tp_x", "tp_z")), x_gather="tp_y",
                                w_gather="tp_z", reduce_scatter="tp_x"),
                embedding=EmbeddingSpec(r, Split.of(d0=("tp_x", "tp_z"), d1="tp_y"), w_gather="tp_z",
                                        vocab="tp_x", ids_rows=("tp_z",), reduce_scatter="tp_x"))


# a tensor mode's ``layers`` family -> its layer plan
LAYER_PLANS = {"1d": _one_d, "2d": _two_d, "3d": _three_d}


def plan_for(mode) -> Plan:
    """The layer plan of a :class:`tessel.choices.TensorMode` (or its name)."""
    layers = tensor_mode(mode).layers
    if layers not in LAYER_PLANS:
        raise PlanError(f"no layer plan for tensor layers '{layers}'; valid: {', '.join(LAYER_PLANS)}")
    plan = LAYER_PLANS[layers]()
    plan.check()
    return plan
