"""A wide MLP classifier: few FLOPs per parameter, so data parallelism is bound by gradient traffic.

It plays the part of VGG's large fully connected layers: tens of millions of dense parameters whose
gradients must all be exchanged every step, the opposite of the sparse LM embeddings.

Example::

    >>> import torch
    >>> model = DenseClassifier(in_features=32, hidden=64, layers=2, classes=10)
    >>> loss = model(torch.randn(4, 32), torch.randint(0, 10, (4,)))
    >>> tuple(model.logits(torch.randn(4, 32)).shape)
    (4, 10)
"""

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_dropout, check_int


class DenseClassifier(nn.Module):
    """``layers`` x (Linear -> ReLU [-> Dropout]) of width ``hidden``, then Linear to ``classes``."""

    def __init__(self, in_features: int = 1024, hidden: int = 2048, layers: int = 3, classes: int = 100,
                 dropout: float = 0.0):
        super().__init__()
        check_int("in_features", in_features)
        check_int("hidden", hidden)
        check_int("layers", layers)
        self.classes = check_int("classes", classes, low=2)
        dropout = check_dropout(dropout)

        mods: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            mods += [nn.Linear(width, hidden), nn.ReLU()]
            if dropout > 0:
                mods.append(nn.Dropout(dropout))
            width = hidden
        mods.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*mods)

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Features (B, in_features) -> class logits (B, classes)."""
        return self.net(inputs)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the batch."""
        return F.cross_entropy(self.net(inputs), targets)
