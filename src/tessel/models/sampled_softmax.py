"""Sampled softmax (Jean et al. 2015), the output layer of the LM1B language models.

With a vocabulary of hundreds of thousands of words the full softmax costs one dot product per word per
token. Sampled softmax scores only the true word plus ``num_sampled`` candidates drawn from a log-uniform
(Zipf) proposal and corrects the logits by the log expected count of each candidate, which keeps the loss
an approximately unbiased estimate of full softmax cross-entropy. Only the rows of the output table for
targets and candidates are read, so the table's gradient is row-sparse.

Example::

    >>> import torch
    >>> head = SampledSoftmax(vocab_size=1000, dim=16, num_sampled=32)
    >>> hidden, targets = torch.randn(8, 16), torch.randint(0, 1000, (8,))
    >>> loss = head(hidden, targets)          # training: sampled estimate
    >>> _ = head.eval(); exact = head(hidden, targets)   # eval: exact full softmax
    >>> bool(torch.isfinite(loss)), tuple(head.full_logits(hidden).shape)
    (True, (8, 1000))
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from tessel.errors import ConfigError

from ._checks import check_int


def log_uniform_sample(num_sampled: int, vocab_size: int) -> torch.Tensor:
    """Draw ``num_sampled`` ids (with replacement) from P(c) = log((c+2)/(c+1)) / log(V+1).

    Uses the global CPU torch RNG on purpose: ranks seeded alike draw the same candidates, and a
    checkpointed RNG state replays the exact same draws after resume.
    """
    u = torch.rand(num_sampled, dtype=torch.float64)
    ids = torch.floor(torch.exp(u * math.log(vocab_size + 1))) - 1
    # u < 1 keeps ids below vocab_size in exact arithmetic; the clamp guards rounding at the edge
    return ids.long().clamp_(0, vocab_size - 1)


def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log P(c) of the log-uniform proposal, in float64 (callers cast to their dtype)."""
    c = ids.to(torch.float64)
    return torch.log(torch.log1p(1.0 / (c + 1.0))) - math.log(math.log(vocab_size + 1))


class SampledSoftmax(nn.Module):
    """Output projection ``hidden @ W^T + b`` trained with sampled softmax, evaluated with full softmax.

    ``weight`` (and ``bias``) are ``nn.Embedding`` tables so that training reads rows by id; the rows
    not among the targets or candidates of a step get exactly zero gradient.
    """

    def __init__(self, vocab_size: int, dim: int, num_sampled: int = 256, bias: bool = True):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, low=2)
        self.dim = check_int("dim", dim)
        self.num_sampled = check_int("num_sampled", num_sampled)
        if num_sampled >= vocab_size:
            # sampling as many candidates as there are words costs more than the full softmax it estimates
            raise ConfigError(f"num_sampled is {num_sampled}; it must be < vocab_size ({vocab_size})")
        self.weight = nn.Embedding(vocab_size, dim)
        self.bias = nn.Embedding(vocab_size, 1) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight.weight, mean=0.0, std=0.02)
        if self.bias is not None:
            nn.init.zeros_(self.bias.weight)

    def sample_candidates(self) -> torch.Tensor:
        """One draw of candidate ids; ``forward`` calls this exactly once per training step."""
        return log_uniform_sample(self.num_sampled, self.vocab_size)

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary: (..., dim) -> (..., vocab_size)."""
        logits = hidden @ self.weight.weight.t()
        if self.bias is not None:
            logits = logits + self.bias.weight.squeeze(-1)
        return logits

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = self.weight(ids)
        b = self.bias(ids).squeeze(-1) if self.bias is not None else None
        return w, b

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss over tokens: hidden (N, dim) (or (..., dim)), targets (N,) (or (...)) long."""
        hidden = hidden.reshape(-1, self.dim)
        targets = targets.reshape(-1)
        if not self.training:
            return F.cross_entropy(self.full_logits(hidden), targets)

        candidates = self.sample_candidates().to(targets.device)
        # one lookup for targets and candidates, so the table is read exactly once per step
        w, b = self._rows(torch.cat([targets, candidates]))
        n = targets.numel()
        true_w, cand_w = w[:n], w[n:]
        true_logits = (hidden * true_w).sum(-1)
        cand_logits = hidden @ cand_w.t()
        if b is not None:
            true_logits = true_logits + b[:n]
            cand_logits = cand_logits + b[n:]

        # subtract log expected count log(S * P(c)) so the estimate is corrected for the proposal
        log_s = math.log(self.num_sampled)
        true_logits = true_logits - (log_s + log_uniform_log_prob(targets, self.vocab_size)).to(hidden)
        cand_logits = cand_logits - (log_s + log_uniform_log_prob(candidates, self.vocab_size)).to(hidden)

        # a candidate equal to the target would count the true word as a negative; a finite (not -inf)
        # fill keeps float64 gradients free of NaN
        hits = candidates.unsqueeze(0) == targets.unsqueeze(1)
        cand_logits = cand_logits.masked_fill(hits, torch.finfo(cand_logits.dtype).min)

        logits = torch.cat([true_logits.unsqueeze(1), cand_logits], dim=1)
        zeros = torch.zeros(n, dtype=torch.long, device=targets.device)
        return F.cross_entropy(logits, zeros)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, dim={self.dim}, num_sampled={self.num_sampled}, "
                f"bias={self.bias is not None}")
