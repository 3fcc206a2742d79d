"""The models tessel trains: plain ``nn.Module``s with one interface, ``forward(inputs, targets) -> loss``.

Every model returns the scalar mean loss from ``forward`` and full logits from ``logits(inputs)``, so
the trainer and the parallel wrappers treat them alike. None of them knows about distribution.

Example::

    >>> m = build_model("classifier", vocab_size=0, seq_len=0, dim=0, hidden=64, layers=1, heads=0,
    ...                 dropout=0.0, tie_embeddings=False, softmax="full", num_sampled=0,
    ...                 in_features=8, classes=4)
    >>> count_parameters(m)
    836
"""

from torch import nn

from tessel.choices import MODELS
from tessel.errors import ConfigError

from .classifier import DenseClassifier
from .lstm_lm import LSTMLM
from .sampled_softmax import SampledSoftmax, log_uniform_sample
from .transformer_lm import TransformerLM
from .vocab_head import VocabHead, linear_cross_entropy

__all__ = ["MODELS", "DenseClassifier", "LSTMLM", "SampledSoftmax", "TransformerLM", "build_model",
           "count_parameters", "linear_cross_entropy", "log_uniform_sample", "VocabHead"]

# the width used when hidden is 0 or None, per model
_DEFAULT_HIDDEN = {"transformer_lm": lambda dim: 4 * dim, "lstm_lm": lambda dim: 4 * dim,
                   "classifier": lambda dim: 2048}


def build_model(name: str, *, vocab_size: int, seq_len: int, dim: int, hidden: int, layers: int, heads: int,
                dropout: float, tie_embeddings: bool, softmax: str, num_sampled: int, in_features: int,
                classes: int) -> nn.Module:
    """Construct model ``name`` from the flat model config, passing each model only the args it uses.

    ``hidden`` is the transformer MLP width, the LSTM cell size or the classifier width; 0 or None
    picks the default (4*dim for the LMs, 2048 for the classifier).
    """
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    hidden = hidden or _DEFAULT_HIDDEN[name](dim)
    if name == "transformer_lm":
        return TransformerLM(vocab_size, seq_len, dim=dim, layers=layers, heads=heads, hidden=hidden,
                             dropout=dropout, tie_embeddings=tie_embeddings, softmax=softmax,
                             num_sampled=num_sampled)
    if name == "lstm_lm":
        return LSTMLM(vocab_size, dim=dim, hidden=hidden, layers=layers, dropout=dropout, softmax=softmax,
                      num_sampled=num_sampled)
    return DenseClassifier(in_features=in_features, hidden=hidden, layers=layers, classes=classes,
                           dropout=dropout)


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements; a tied weight counts once."""
    return sum(p.numel() for p in model.parameters())
