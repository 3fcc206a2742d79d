"""Optimizers that update only given rows of a table: what an owner applies to the rows pushed to it.

Rows nobody touched in a step are left exactly as they are, state included (lazy semantics). For
SGD without momentum and for Adagrad that equals the dense optimizer, whose update of a zero-gradient
row is zero; for momentum and Adam it is the lazy variant (``torch.optim.SparseAdam`` for Adam).

Weight decay is lazy too: it acts on the rows a step touched, as torch's rule for that optimizer would
(L2 added to the gradient for sgd/adagrad/adam, AdamW's decoupled shrink by ``1 - lr * wd``). A row left
untouched for k steps is not decayed for them, where dense decay shrinks every row every step: a rare
word's vector is only pulled toward zero when it is used. Where a step touches every row it equals torch.

    opt = RowOptimizer("adagrad", lr=0.1)
    state = opt.init(table)                      # per-row state, shaped like the table
    opt.update(table, state, rows, grads, lr=0.1)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .. import choices
from ..choices import Optimizer
from ..errors import ConfigError, TesselError


class _Rule(ABC):
    """One row update rule: its state, its step, torch's eps, whether weight decay is decoupled (AdamW)."""

    eps = 1e-8
    decoupled = False

    @abstractmethod
    def init(self, opt: RowOptimizer, table: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh state for ``table``."""

    @abstractmethod
    def step(self, opt: RowOptimizer, table, state, rows, grads, lr) -> None:
        """Update ``table[rows]`` with ``grads`` (weight decay already applied)."""


class _SGD(_Rule):
    def init(self, opt, table):
        return {"momentum": torch.zeros_like(table)} if opt.momentum else {}

    def step(self, opt, table, state, rows, grads, lr):
        if opt.momentum:
            buf = state["momentum"]
            buf[rows] = buf[rows] * opt.momentum + grads
            grads = buf[rows]
        table.index_add_(0, rows, grads, alpha=-lr)


class _Adagrad(_Rule):
    eps = 1e-10  # torch's default

    def init(self, opt, table):
        return {"sum": torch.full_like(table, opt.initial_accumulator)}

    def step(self, opt, table, state, rows, grads, lr):
        acc = state["sum"]
        acc.index_add_(0, rows, grads * grads)
        table.index_add_(0, rows, grads / (acc[rows].sqrt() + opt.eps), alpha=-lr)


class _Adam(_Rule):
    def init(self, opt, table):
        return {"exp_avg": torch.zeros_like(table), "exp_avg_sq": torch.zeros_like(table),
                "step": torch.zeros((), dtype=torch.int64)}

    def step(self, opt, table, state, rows, grads, lr):
        # SparseAdam: the step count is per table, moments move only on touched rows.
        state["step"] += 1
        step = int(state["step"])
        b1, b2 = opt.betas
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m_rows = m[rows].mul_(b1).add_(grads, alpha=1 - b1)
        v_rows = v[rows].mul_(b2).addcmul_(grads, grads, value=1 - b2)
        m[rows], v[rows] = m_rows, v_rows
        step_size = lr * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)
        table.index_add_(0, rows, m_rows / (v_rows.sqrt() + opt.eps), alpha=-step_size)


class _AdamW(_Adam):
    decoupled = True


# Optimizer.rows -> its row update rule
RULES: dict[str, _Rule] = {"sgd": _SGD(), "adagrad": _Adagrad(), "adam": _Adam(), "adamw": _AdamW()}
KINDS = tuple(RULES)


class RowOptimizer:
    def __init__(self, kind: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, betas=(0.9, 0.999),
                 eps: float | None = None, initial_accumulator: float = 0.0):
        if kind not in RULES:
            raise ConfigError(f"row optimizer '{kind}' is unknown; valid: {', '.join(RULES)}")
        self.kind, self.rule, self.lr, self.momentum, self.betas = kind, RULES[kind], lr, momentum, betas
        self.weight_decay = weight_decay
        self.eps = eps if eps is not None else self.rule.eps
        self.initial_accumulator = initial_accumulator

    def init(self, table: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh state for ``table`` (its own rows only), as named tensors shaped like it."""
        return self.rule.init(self, table)

    @torch.no_grad()
    def update(self, table: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor, grads: torch.Tensor,
               lr: float | None = None) -> None:
        """Apply one step to ``table[rows]`` with ``grads`` (one row each, ``rows`` unique)."""
        lr = self.lr if lr is None else lr
        wd = self.weight_decay
        if wd and self.rule.decoupled:
            table[rows] = table[rows] * (1 - lr * wd)  # decoupled: shrink the touched rows, then Adam
        elif wd:
            grads = grads + wd * table[rows]  # L2, as torch's SGD/Adagrad/Adam add it to the gradient
        self.rule.step(self, table, state, rows, grads, lr)


def record_of(opt: torch.optim.Optimizer) -> Optimizer | None:
    """The :class:`tessel.choices.Optimizer` whose torch class ``opt`` is, or None."""
    return next((o for o in choices.records(Optimizer) if getattr(torch.optim, o.torch_class) is type(opt)), None)


def auto_mirror(opt: torch.optim.Optimizer, group: dict, lazy: bool, named: bool, say: bool) -> RowOptimizer | None:
    """:func:`mirror`, or None where no served strategy was ``named`` (``auto`` decides) and no exact row form
    exists (momentum, Adam, AdamW or weight decay without ``lazy``): auto then keeps every table dense, never
    changing the math unasked. A named strategy is refused with the reason instead."""
    try:
        return mirror(opt, group, lazy)
    except TesselError as e:
        if named:
            raise
        if say:
            print(f"tessel: auto keeps every table dense: {e}", flush=True)
        return None


def mirror(opt: torch.optim.Optimizer, group: dict, lazy: bool) -> RowOptimizer:
    """The row optimizer mirroring ``opt``'s param group ``group`` (the one holding the tables), or TesselError
    with the reason; ``lazy``: accept lazy updates where torch's would move rows whose gradient is zero."""
    rec = record_of(opt)
    if rec is None or rec.rows not in RULES:
        known = ", ".join(o.torch_class for o in choices.records(Optimizer) if o.rows in RULES)
        raise TesselError(f"{type(opt).__name__} cannot update table rows; tessel mirrors {known} for them (or pass "
                          "plan='dense')")
    unsupported = [k for k, bad in (("nesterov", group.get("nesterov")), ("dampening", group.get("dampening")),
                                    ("lr_decay", group.get("lr_decay")), ("amsgrad", group.get("amsgrad")),
                                    ("maximize", group.get("maximize"))) if bad]
    if unsupported:
        raise TesselError(f"{type(opt).__name__} with {', '.join(unsupported)} cannot update table rows; set "
                          f"{'/'.join(unsupported)} off or pass plan='dense'")
    not_exact = rec.lazy_rows or group.get("momentum", 0) or group.get("weight_decay", 0)
    if not_exact and not lazy:
        raise TesselError(f"{type(opt).__name__} with its settings moves rows whose gradient is zero (momentum, "
                          "moments or weight decay); served rows move only when touched: pass lazy=True to "
                          "accept lazy row updates, or use SGD without momentum or Adagrad for exact ones")
    extra = {"momentum": group.get("momentum", 0.0), "weight_decay": group.get("weight_decay", 0.0),
             "eps": group.get("eps"), "initial_accumulator": group.get("initial_accumulator_value", 0.0)}
    if "betas" in group:
        extra["betas"] = group["betas"]
    return RowOptimizer(rec.rows, group.get("lr", 0.0), **extra)
