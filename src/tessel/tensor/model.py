"""Tensor-parallel layers put into the reference models in place, per module, parameter names unchanged.

``apply_transformer`` and ``apply_classifier`` (registered per model class) replace the submodules a
(pipeline-pruned) model holds by tensor-parallel layers built from their full weights (same seed on every
rank, so the same full weights) and return the chain that runs them; ``tok_emb.weight``,
``blocks.0.attn.q_proj.weight``, ... name the same tensors as in the plain model, which is what lets a
checkpoint move between modes, degrees and pipeline cuts.

Attention runs on this rank's heads and batch rows with no communication: q, k and v come out of one
sharded GEMM split by heads, exactly as in the plain model's code path.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ..chain import Chain, Layer
from ..errors import PlanError
from ..models import LSTMLM, DenseClassifier, TransformerLM
from ..models.attention import causal_attention
from ..models.transformer_lm import CausalSelfAttention
from ..registry import register_model
from . import cost, ops
from .grid import Grid, Split
from .layers import (
    TPEmbedding,
    TPLayerNorm,
    TPLinear,
    TPPositions,
    block_of,
    block_shape,
    linear,
    rows_of,
    vocab_cross_entropy,
)
from .layout import Layout, Plan
from .native import parallelize_native


class TPAttention(nn.Module):
    def __init__(self, full, plan: Plan, grid: Grid, regather: bool, name: str) -> None:
        super().__init__()
        self.grid, self.plan, self.regather = grid, plan, regather
        self.head_dim = full.head_dim
        for proj in ("q_proj", "k_proj", "v_proj"):
            setattr(self, proj, TPLinear(getattr(full, proj), plan.up, grid, regather, f"{name}.{proj}"))
        self.out_proj = TPLinear(full.out_proj, plan.down, grid, regather, f"{name}.out_proj")
        heads, parts = full.q_proj.out_features // self.head_dim, grid.size(plan.up.out.cols)
        if heads % parts:
            raise PlanError(f"{heads} attention heads do not split over {parts} ranks of grid axis "
                            f"{plan.up.out.cols} ({grid.spec}); use heads divisible by {parts}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.q_proj.check_input(x)
        projs = (self.q_proj, self.k_proj, self.v_proj)
        qkv = linear(x, [p.weight for p in projs], [p.bias for p in projs], self.plan.up, self.grid, self.regather)
        b, t, _ = qkv.shape
        q, k, v = (y.reshape(b, t, -1, self.head_dim).transpose(1, 2) for y in qkv.chunk(3, -1))
        y = causal_attention(q, k, v)  # (B, this rank's heads, T, head_dim)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class TPMLP(nn.Module):
    def __init__(self, full, plan: Plan, grid: Grid, regather: bool, name: str) -> None:
        super().__init__()
        self.fc_in = TPLinear(full.fc_in, plan.up, grid, regather, f"{name}.fc_in")
        self.fc_out = TPLinear(full.fc_out, plan.down, grid, regather, f"{name}.fc_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class TPBlock(nn.Module):
    def __init__(self, full, plan: Plan, grid: Grid, regather: bool, name: str) -> None:
        super().__init__()
        self.ln1 = TPLayerNorm(full.ln1, plan.residual, grid, f"{name}.ln1")
        self.attn = TPAttention(full.attn, plan, grid, regather, f"{name}.attn")
        self.ln2 = TPLayerNorm(full.ln2, plan.residual, grid, f"{name}.ln2")
        self.mlp = TPMLP(full.mlp, plan, grid, regather, f"{name}.mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _present(root: nn.Module, path: str) -> bool:
    """Whether this stage holds ``path`` (pipeline cuts replace the others by a parameter-free Identity)."""
    return not isinstance(root.get_submodule(path), nn.Identity)


def _check_plain(root: nn.Module) -> None:
    if any(m.p > 0 for m in root.modules() if isinstance(m, nn.Dropout)) or any(
            getattr(m, "dropout", 0) for m in root.modules() if isinstance(m, CausalSelfAttention)):
        raise PlanError("tensor parallelism runs with model.dropout 0 (replicated and split activations would "
                        "draw different masks); set dropout 0")


class ShardedLoss:
    """Mean cross-entropy over the dp rank's whole micro-batch from this rank's block of the logits (any rows
    and class split, ``layout``); the same value on every rank of the grid."""

    def __init__(self, grid: Grid, layout: Layout) -> None:
        self.grid, self.layout = grid, layout

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with ops.channel("tp.loss"):  # per-row statistics in fp32: a channel apart from the head's bf16 linear
            total = targets.numel()
            mine = rows_of(self.grid, targets, self.layout.rows, "targets").reshape(-1)
            return vocab_cross_entropy(logits.reshape(-1, logits.shape[-1]), mine, self.layout, self.grid, total)

    def traffic(self, rows: int, recompute: bool = False) -> list[tuple[str, str, float, int, int]]:
        """(channel, grid axis, elements sent, ring steps, calls) per micro-batch of ``rows`` targets (tensor.cost); the
        loss is never recomputed."""
        return [("tp.loss", *t) for t in cost.loss_traffic(self.layout, self.grid.sizes, rows)]


def tp_chain(chain: Chain, grid: Grid, layouts: list[Layout], first: Layout | None = None,
              loss=None) -> Chain:
    """``chain`` running on tensor-parallel layers whose outputs have ``layouts``; ``first``: the layout the
    first layer's whole input is cut into (None: the layer cuts its input itself, as the embedding does);
    ``loss``: the chain's own loss where the last layout is whole (None: the vocabulary-parallel one)."""
    layers = list(chain.layers)
    if first is not None:
        head = layers[0]
        layers[0] = Layer(head.name, head.owns, lambda r, x: head.run(r, block_of(grid, x, first, "input")))
    return Chain(layers, loss or ShardedLoss(grid, layouts[-1]),
                 lambda i, shape: block_shape(grid, shape, layouts[i]))


def replicated(module: nn.Module) -> None:
    """Mark ``module``'s parameters as whole on every rank of the grid: same inputs, same gradients (counted
    once in the norm, a Replicate placement in checkpoints)."""
    for p in module.parameters():
        p.tp_split, p.tp_partial = Split(), ()


def apply_transformer(root: nn.Module, chain: Chain, grid: Grid, plan: Plan, regather: bool = False) -> Chain:
    """Replace the TransformerLM's submodules present on this stage by their tensor-parallel versions in place
    (same parameter names); returns the chain that runs them, with the vocabulary-parallel loss."""
    sampled = getattr(root, "softmax", "full") == "sampled"
    if sampled and not grid.spec.mode.whole_hidden:
        raise PlanError(f"model.softmax=sampled with tp-mode {grid.spec.mode.name}: the sampled head reads whole "
                        "hidden states, which only 1-D tensor parallelism keeps on every rank (its tables are then "
                        "served over dp); valid: --tp-mode 1d, or model.softmax=full")
    if _present(root, "head") and _present(root, "tok_emb") and root.head.weight is root.tok_emb.weight:
        raise PlanError("tensor parallelism does not support model.tie_embeddings (the table and the head are "
                        "cut differently); set tie_embeddings false")
    _check_plain(root)
    if _present(root, "tok_emb"):
        root.tok_emb = TPEmbedding(root.tok_emb, plan.embedding, grid, "tok_emb")
        root.pos_emb = TPPositions(root.pos_emb, plan.residual, grid, "pos_emb")
    for i, block in enumerate(root.blocks):
        if not isinstance(block, nn.Identity):
            root.blocks[i] = TPBlock(block, plan, grid, regather, f"blocks.{i}")
    if _present(root, "head"):
        root.ln_f = TPLayerNorm(root.ln_f, plan.residual, grid, "ln_f")
        if sampled:  # 1-D: every rank has the whole hidden state and runs the whole head (a table, served over dp)
            replicated(root.head)
        else:
            root.head = TPLinear(root.head, plan.up, grid, regather, "head", channel="tp.head")
    if not sampled:  # the split head makes logits, for the vocabulary-parallel loss
        end = chain.layers[-1]
        chain = replace(chain, layers=[*chain.layers[:-1], Layer(end.name, end.owns, lambda r, x: r.head(r.ln_f(x)))])
    # embedding and blocks hand on the residual stream; the head's logits are cut like an up-projection's output
    last = plan.residual if sampled else plan.up.out
    return tp_chain(chain, grid, [plan.residual] * (len(chain.layers) - 1) + [last],
                     loss=chain.loss if sampled else None)


def apply_classifier(root: nn.Module, chain: Chain, grid: Grid, plan: Plan, regather: bool = False) -> Chain:
    """The classifier's linears alternate up (column in 1-D, L(y,x) in 3-D) and down (row, L(x,y)), as a
    Transformer's MLP does, so activations stay split between them; the features are cut into the residual
    layout before the first, and the logits' layout is whatever the last linear gives."""
    _check_plain(root)
    layouts = []
    for j, layer in enumerate(chain.layers):
        path = layer.owns[0]  # the layer's Linear; the ReLU (and Dropout) after it need no change
        spec = plan.up if j % 2 == 0 else plan.down
        if _present(root, path):
            root.set_submodule(path, TPLinear(root.get_submodule(path), spec, grid, regather, path))
        layouts.append(spec.out)
    return tp_chain(chain, grid, layouts, first=plan.up.inp)


def transformer_linears(m: TransformerLM) -> list[list[tuple[int, int, bool, str]]]:
    """What apply_transformer makes of each chain layer: the embedding (its own channel, not a linear), per
    block q/k/v as one h -> 3h, out_proj, fc_in, fc_out, and the vocabulary-parallel head (none for a sampled
    softmax, which every rank runs whole). fc_out ends its block (the residual add after it saves nothing) and
    the head its layer."""
    h, f = m.tok_emb.weight.shape[1], m.blocks[0].mlp.fc_in.weight.shape[0] if len(m.blocks) else 0
    block = [(h, 3 * h, True, "tp", False), (h, h, False, "tp", False), (h, f, True, "tp", False),
             (f, h, False, "tp", True)]
    head = [] if m.softmax == "sampled" else [(h, m.head.weight.shape[0], True, "tp.head", True)]  # sampled: whole
    return [[], *[block for _ in m.blocks], head]


def classifier_linears(m: DenseClassifier) -> list[list[tuple[int, int, bool, str]]]:
    """apply_classifier's linears, alternating up and down, one per chain layer; a ReLU after each but the last,
    which ends the model."""
    linears = [mod for mod in m.net if isinstance(mod, nn.Linear)]
    return [[(lin.in_features, lin.out_features, j % 2 == 0, "tp", j + 1 == len(linears))]
            for j, lin in enumerate(linears)]


def refuse_lstm(root: nn.Module, chain: Chain, grid: Grid, plan: Plan, regather: bool = False) -> Chain:
    """The LSTM LM has no tensor-parallel form: registered so that asking for one says why."""
    raise PlanError(f"tensor parallelism (tp={math.prod(grid.spec.shape)}) applies to models transformer_lm and "
                    "classifier, not lstm_lm (nn.LSTM runs its gates as one fused kernel that has no tensor-parallel "
                    "form here); use tp=1")


register_model(TransformerLM, tensor=apply_transformer, linears=transformer_linears, torch_tensor=parallelize_native)
register_model(LSTMLM, tensor=refuse_lstm)
register_model(DenseClassifier, tensor=apply_classifier, linears=classifier_linears)
