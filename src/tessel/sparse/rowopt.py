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

import torch

from ..errors import ConfigError, TesselError

KINDS = ("sgd", "adagrad", "adam", "adamw")


def row_kind(dense_optimizer: str) -> str:
    """The row optimizer that goes with a dense one (Adam and AdamW rows are lazy)."""
    return {"sgd": "sgd", "adagrad": "adagrad", "adam": "adam", "adamw": "adamw"}[dense_optimizer]


class RowOptimizer:
    def __init__(self, kind: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, betas=(0.9, 0.999),
                 eps: float | None = None, initial_accumulator: float = 0.0):
        if kind not in KINDS:
            raise ConfigError(f"row optimizer '{kind}' is unknown; valid: {', '.join(KINDS)}")
        self.kind, self.lr, self.momentum, self.betas = kind, lr, momentum, betas
        self.weight_decay = weight_decay
        # torch's defaults: Adagrad eps 1e-10, Adam 1e-8.
        self.eps = eps if eps is not None else (1e-10 if kind == "adagrad" else 1e-8)
        self.initial_accumulator = initial_accumulator

    def init(self, table: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh state for ``table`` (its own rows only), as named tensors shaped like it."""
        if self.kind == "sgd":
            return {"momentum": torch.zeros_like(table)} if self.momentum else {}
        if self.kind == "adagrad":
            return {"sum": torch.full_like(table, self.initial_accumulator)}
        return {"exp_avg": torch.zeros_like(table), "exp_avg_sq": torch.zeros_like(table),
                "step": torch.zeros((), dtype=torch.int64)}

    @torch.no_grad()
    def update(self, table: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor, grads: torch.Tensor,
               lr: float | None = None) -> None:
        """Apply one step to ``table[rows]`` with ``grads`` (one row each, ``rows`` unique)."""
        lr = self.lr if lr is None else lr
        wd = self.weight_decay
        if wd and self.kind == "adamw":
            table[rows] = table[rows] * (1 - lr * wd)  # decoupled: shrink the touched rows, then Adam
        elif wd:
            grads = grads + wd * table[rows]  # L2, as torch's SGD/Adagrad/Adam add it to the gradient
        if self.kind == "sgd":
            if self.momentum:
                buf = state["momentum"]
                buf[rows] = buf[rows] * self.momentum + grads
                grads = buf[rows]
            table.index_add_(0, rows, grads, alpha=-lr)
        elif self.kind == "adagrad":
            acc = state["sum"]
            acc.index_add_(0, rows, grads * grads)
            table.index_add_(0, rows, grads / (acc[rows].sqrt() + self.eps), alpha=-lr)
        else:
            # SparseAdam: the step count is per table, moments move only on touched rows.
            state["step"] += 1
            step = int(state["step"])
            b1, b2 = self.betas
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m_rows = m[rows].mul_(b1).add_(grads, alpha=1 - b1)
            v_rows = v[rows].mul_(b2).addcmul_(grads, grads, value=1 - b2)
            m[rows], v[rows] = m_rows, v_rows
            step_size = lr * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)
            table.index_add_(0, rows, m_rows / (v_rows.sqrt() + self.eps), alpha=-step_size)


# torch's optimizers that a row optimizer can mirror, by the config's name for them
TORCH_KINDS = {torch.optim.SGD: "sgd", torch.optim.Adagrad: "adagrad", torch.optim.Adam: "adam",
               torch.optim.AdamW: "adamw"}


def mirror(opt: torch.optim.Optimizer, group: dict, lazy: bool) -> RowOptimizer:
    """The row optimizer mirroring ``opt``'s param group ``group`` (the one holding the tables), or TesselError
    with the reason; ``lazy``: accept lazy updates where torch's would move rows whose gradient is zero."""
    kind = TORCH_KINDS.get(type(opt))
    if kind is None:
        raise TesselError(f"{type(opt).__name__} cannot update table rows; tessel mirrors SGD, Adagrad, Adam "
                          "and AdamW for them (or pass plan='dense')")
    unsupported = [k for k, bad in (("nesterov", group.get("nesterov")), ("dampening", group.get("dampening")),
                                    ("lr_decay", group.get("lr_decay")), ("amsgrad", group.get("amsgrad")),
                                    ("maximize", group.get("maximize"))) if bad]
    if unsupported:
        raise TesselError(f"{type(opt).__name__} with {', '.join(unsupported)} cannot update table rows; set "
                          f"{'/'.join(unsupported)} off or pass plan='dense'")
    not_exact = kind in ("adam", "adamw") or group.get("momentum", 0) or group.get("weight_decay", 0)
    if not_exact and not lazy:
        raise TesselError(f"{type(opt).__name__} with its settings moves rows whose gradient is zero (momentum, "
                          "moments or weight decay); served rows move only when touched: pass lazy=True to "
                          "accept lazy row updates, or use SGD without momentum or Adagrad for exact ones")
    extra = {"momentum": group.get("momentum", 0.0), "weight_decay": group.get("weight_decay", 0.0),
             "eps": group.get("eps"), "initial_accumulator": group.get("initial_accumulator_value", 0.0)}
    if "betas" in group:
        extra["betas"] = group["betas"]
    return RowOptimizer(kind, group.get("lr", 0.0), **extra)
