"""GPT-style decoder-only transformer language model, in the spirit of nanoGPT.

Pre-LayerNorm blocks, each an ``attn`` (causal self-attention) and an ``mlp`` submodule, held in
``self.blocks`` so a model can be cut into pipeline stages between blocks. q, k, v and the output
projection are separate Linear layers so tensor parallelism can split them by heads (column-wise) and
by input (row-wise) without untangling a fused qkv.

Example::

    >>> import torch
    >>> model = TransformerLM(vocab_size=100, seq_len=16, dim=32, layers=2, heads=4)
    >>> x = torch.randint(0, 100, (2, 16))
    >>> loss = model(x, x)
    >>> tuple(model.logits(x).shape)
    (2, 16, 100)
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from tessel.errors import ConfigError

from ._checks import check_dropout, check_int, check_softmax
from .sampled_softmax import SampledSoftmax


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        # head count comes from the projection width, so a tensor-parallel shard holding only some
        # heads runs through the same code
        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.out_proj(y.transpose(1, 2).reshape(b, t, -1)))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.fc_in = nn.Linear(dim, hidden)
        self.fc_out = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc_out(F.gelu(self.fc_in(x))))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    """Token + learned position embeddings -> ``layers`` blocks -> LayerNorm -> full or sampled softmax."""

    def __init__(self, vocab_size: int, seq_len: int, dim: int = 128, layers: int = 2, heads: int = 4,
                 hidden: int | None = None, dropout: float = 0.0, tie_embeddings: bool = False,
                 softmax: str = "full", num_sampled: int = 256):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, low=2)
        self.seq_len = check_int("seq_len", seq_len)
        self.dim = check_int("dim", dim)
        check_int("layers", layers)
        check_int("heads", heads)
        hidden = check_int("hidden", hidden) if hidden else 4 * dim
        dropout = check_dropout(dropout)
        check_softmax(softmax, num_sampled, vocab_size)
        if dim % heads:
            raise ConfigError(f"dim ({dim}) is not divisible by heads ({heads}); "
                              f"valid heads: {', '.join(str(h) for h in range(1, dim + 1) if dim % h == 0)}")
        if tie_embeddings and softmax == "sampled":
            raise ConfigError("tie_embeddings is true but softmax is 'sampled'; tying needs softmax 'full'")
        self.softmax = softmax

        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        if softmax == "sampled":
            self.head = SampledSoftmax(vocab_size, dim, num_sampled)
        else:
            self.head = nn.Linear(dim, vocab_size, bias=False)

        self.apply(self._init_weights)
        for block in self.blocks:
            # GPT-2: scale projections into the residual stream so its variance does not grow with depth
            for proj in (block.attn.out_proj, block.mlp.fc_out):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * layers))
        if softmax == "sampled":
            self.head.reset_parameters()  # its bias table must start at zero, not N(0, 0.02)
        if tie_embeddings:
            self.head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> block input (B, T, dim)."""
        t = inputs.size(1)
        if t > self.seq_len:
            raise ConfigError(f"input length {t} exceeds seq_len ({self.seq_len}); "
                              "raise seq_len or feed shorter sequences")
        pos = torch.arange(t, device=inputs.device)
        return self.drop(self.tok_emb(inputs) + self.pos_emb(pos))

    def hidden_states(self, inputs: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> final normalized hidden states (B, T, dim)."""
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits (B, T, vocab_size), for evaluation."""
        h = self.hidden_states(inputs)
        return self.head.full_logits(h) if self.softmax == "sampled" else self.head(h)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss; sampled while training with softmax='sampled', exact otherwise."""
        h = self.hidden_states(inputs)
        if self.softmax == "sampled":
            return self.head(h.reshape(-1, self.dim), targets.reshape(-1))
        return F.cross_entropy(self.head(h).reshape(-1, self.vocab_size), targets.reshape(-1))
