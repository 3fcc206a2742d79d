"""LSTM language model in the style of the LM1B "big LSTM" (Jozefowicz et al. 2016).

An LSTM with a projection layer (``proj_size``) keeps the recurrent state small while the cell is wide,
and a sampled softmax makes a large vocabulary affordable. The embedding and the sampled output table
are read by row only, which is what makes this model's gradients mostly sparse.

Example::

    >>> import torch
    >>> model = LSTMLM(vocab_size=500, dim=16, hidden=32, num_sampled=20)
    >>> x = torch.randint(0, 500, (2, 8))
    >>> loss = model(x, x)
    >>> tuple(model.logits(x).shape)
    (2, 8, 500)
"""

import warnings

import torch
from torch import nn

from tessel.errors import ConfigError

from ._checks import check_dropout, check_int, check_softmax
from .sampled_softmax import SampledSoftmax
from .vocab_head import VocabHead

# CPU builds with oneDNN fall back to the native kernel for projected LSTMs and say so on every run;
# the fallback is exact, so the notice is noise in training logs
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")


class LSTMLM(nn.Module):
    """Embedding -> projected LSTM -> dropout -> sampled or full softmax."""

    def __init__(self, vocab_size: int, dim: int = 128, hidden: int = 512, layers: int = 1,
                 dropout: float = 0.0, softmax: str = "sampled", num_sampled: int = 256):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, low=2)
        self.dim = check_int("dim", dim)
        check_int("hidden", hidden)
        check_int("layers", layers)
        dropout = check_dropout(dropout)
        check_softmax(softmax, num_sampled, vocab_size)
        if hidden <= dim:
            # nn.LSTM needs proj_size < hidden_size; the projection is what keeps the state small
            raise ConfigError(f"hidden is {hidden}; the LSTM cell must be wider than dim ({dim})")
        self.softmax = softmax

        self.embedding = nn.Embedding(vocab_size, dim)
        # nn.LSTM's own dropout acts between stacked layers only (it warns if given with one layer)
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, proj_size=dim, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        if softmax == "sampled":
            self.head = SampledSoftmax(vocab_size, dim, num_sampled)
        else:
            self.head = VocabHead(dim, vocab_size)
            # small output weights start the loss near log(vocab_size), i.e. a uniform prediction
            nn.init.normal_(self.head.weight, mean=0.0, std=0.02)
            nn.init.zeros_(self.head.bias)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=0.02)

    def hidden_states(self, inputs: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> last-layer outputs (B, T, dim), starting from a zero state."""
        out, _ = self.lstm(self.embedding(inputs))
        return self.drop(out)

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits (B, T, vocab_size), for evaluation."""
        h = self.hidden_states(inputs)
        return self.head.full_logits(h) if self.softmax == "sampled" else self.head(h)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss; sampled while training with softmax='sampled', exact otherwise."""
        h = self.hidden_states(inputs)
        if self.softmax == "sampled":
            return self.head(h.reshape(-1, self.dim), targets.reshape(-1))
        return self.head(h, targets)  # fused: the (B*T, vocab) logits never whole (models.vocab_head)
