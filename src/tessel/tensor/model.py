"""The reference TransformerLM rebuilt from tensor-parallel layers, parameter names unchanged.

``TPTransformerLM.from_plain(model, grid, plan)`` takes the plain model (same seed on every rank, so the
same full weights) and keeps each rank's blocks; ``tok_emb.weight``, ``blocks.0.attn.q_proj.weight``, ...
name the same tensors as in the plain model, which is what lets a checkpoint move between modes.

Attention runs on this rank's heads and batch rows with no communication: q, k and v come out of one
sharded GEMM split by heads, exactly as in the plain model's code path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PlanError
from . import ops
from .grid import Grid
from .layers import TPEmbedding, TPLayerNorm, TPLinear, TPPositions, linear, rows_of, vocab_cross_entropy
from .layout import Plan


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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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


class TPTransformerLM(nn.Module):
    def __init__(self, plain, plan: Plan, grid: Grid, regather: bool = False) -> None:
        super().__init__()
        if plain.softmax != "full":
            raise PlanError("tensor parallelism needs model.softmax 'full' (the vocabulary is split over the grid); "
                            "the sampled softmax is a data-parallel table, use it with tp=1")
        if plain.head.weight is plain.tok_emb.weight:
            raise PlanError("tensor parallelism does not support model.tie_embeddings (the table and the head are "
                            "cut differently); set tie_embeddings false")
        if any(m.p > 0 for m in plain.modules() if isinstance(m, nn.Dropout)) or plain.blocks[0].attn.dropout:
            raise PlanError("tensor parallelism runs with model.dropout 0 (replicated and split activations would "
                            "draw different masks); set dropout 0")
        self.plan, self.grid = plan, grid
        self.vocab_size, self.seq_len, self.dim = plain.vocab_size, plain.seq_len, plain.dim
        self.tok_emb = TPEmbedding(plain.tok_emb, plan.embedding, grid, "tok_emb")
        self.pos_emb = TPPositions(plain.pos_emb, plan.residual, grid, "pos_emb")
        self.blocks = nn.ModuleList(TPBlock(b, plan, grid, regather, f"blocks.{i}") for i, b in enumerate(plain.blocks))
        self.ln_f = TPLayerNorm(plain.ln_f, plan.residual, grid, "ln_f")
        self.head = TPLinear(plain.head, plan.up, grid, regather, "head")

    def hidden_states(self, inputs: torch.Tensor) -> torch.Tensor:
        t = inputs.size(1)
        if t > self.seq_len:
            raise PlanError(f"input length {t} exceeds seq_len ({self.seq_len})")
        x = self.tok_emb(inputs) + self.pos_emb(t)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss over the dp rank's whole batch; the same value on every rank of the grid."""
        h = self.hidden_states(inputs)
        with ops.channel("tp.head"):
            out = self.plan.up.out
            targets = rows_of(self.grid, targets, out.rows, "targets")
            return vocab_cross_entropy(self.head(h), targets, out, self.grid, inputs.numel())
