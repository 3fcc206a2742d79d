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
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from tessel.errors import ConfigError

from ._checks import check_dropout, check_int, check_softmax
from .attention import causal_attention
from .sampled_softmax import SampledSoftmax
from .vocab_head import VocabHead


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
        y = causal_attention(q, k, v, self.dropout if self.training else 0.0)  # (B, heads, T, head_dim)
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

    # the full softmax's loss runs fused in the head (models.vocab_head); False makes the logits whole first, for
    # a wrapper that needs them (torch's loss_parallel takes the head's vocabulary-sharded logits)
    fused_loss = True

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
        rng = torch.get_rng_state()  # building draws nothing from the global generator (see init_parameter)

        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        if softmax == "sampled":
            self.head = SampledSoftmax(vocab_size, dim, num_sampled)
        else:
            self.head = VocabHead(dim, vocab_size, bias=False)

        if tie_embeddings:
            self.head.weight = self.tok_emb.weight
        seed = torch.initial_seed()  # the caller's torch.manual_seed
        for name, p in self.named_parameters():
            self.init_parameter(name, p, seed)
        torch.set_rng_state(rng)

    @torch.no_grad()
    def init_parameter(self, name: str, t: torch.Tensor, seed: int) -> None:
        """Fill ``t`` (the shape of parameter ``name``) with its initial value, drawn from a generator of its own
        seeded by ``seed`` and the name: a rank that builds the model on the meta device and keeps only a shard of
        each weight makes every weight exactly as the whole model does, one at a time. GPT-2's rule: weights
        N(0, 0.02), the projections into the residual stream N(0, 0.02 / sqrt(2 layers)) so its variance does not
        grow with depth, biases (and a sampled softmax's bias table) zero, LayerNorm scales one."""
        if t.is_meta:  # built on the meta device: values are made later, where each shard is kept
            return
        path, _, leaf = name.rpartition(".")
        module = self.get_submodule(path)
        if leaf == "bias" or path.endswith("bias") or (isinstance(module, nn.LayerNorm) and leaf == "weight"):
            t.fill_(1.0 if isinstance(module, nn.LayerNorm) and leaf == "weight" else 0.0)
            return
        if name == "head.weight" and self.head.weight is self.tok_emb.weight:
            name = "tok_emb.weight"  # tied: one weight, one value
        std = 0.02 / math.sqrt(2 * len(self.blocks)) if path.endswith(("attn.out_proj", "mlp.fc_out")) else 0.02
        g = torch.Generator().manual_seed((seed * 2654435761 + zlib.crc32(name.encode())) % 2**63)
        # drawn in fp32 whatever t's dtype, so a model built and then cast (.double()) holds what one made in place
        t.copy_(torch.empty(t.shape, dtype=torch.float32).normal_(0.0, std, generator=g))

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
        if self.fused_loss:  # the (B*T, vocab) logits made and dropped a block of rows at a time
            return self.head(h, targets)
        return F.cross_entropy(self.head(h).reshape(-1, self.vocab_size), targets.reshape(-1))
