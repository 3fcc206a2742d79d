"""GaussianClassification: an infinite, learnable dataset for dense classifiers."""

import numpy as np
import torch

from tessel.data._counter import as_indices, normal, seed_key, uniform
from tessel.errors import DataError

# Class means have norm about MEAN_NORM, so with noise=1 neighbouring classes overlap a little: a
# linear model learns it quickly but does not hit 100% on the first steps.
MEAN_NORM = 3.0

_SALT_MEAN = np.uint64(11)
_SALT_LABEL = np.uint64(12)
_SALT_NOISE = np.uint64(13)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"gaussian {name} {value!r} is invalid; give an int >= 1")
    return int(value)


class GaussianClassification:
    """Infinite classification data: sample ``i`` is ``mean[label_i] + noise * N(0, I)``.

    Each class has a fixed random mean vector derived from ``seed``; the label and the noise of
    sample ``i`` are pure functions of ``(seed, i)``, so any slice of a batch can be generated on
    any rank and matches the single-process batch exactly.

    >>> data = GaussianClassification(in_features=16, classes=4)
    >>> x, y = data.get_batch(np.arange(8))
    >>> x.dtype, tuple(x.shape), y.dtype, tuple(y.shape)
    (torch.float32, (8, 16), torch.int64, (8,))
    """

    num_samples = None

    def __init__(self, in_features: int = 1024, classes: int = 100, seed: int = 0, noise: float = 1.0):
        self.in_features = _positive_int("in_features", in_features)
        self.classes = _positive_int("classes", classes)
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not (0 <= noise < float("inf")):
            raise DataError(f"gaussian noise {noise!r} is invalid; give a finite number >= 0")
        self.noise = float(noise)
        self.seed = seed
        self._key = seed_key(seed)
        cls = np.arange(self.classes, dtype=np.uint64)[:, None]
        feat = np.arange(self.in_features, dtype=np.uint64)[None, :]
        scale = MEAN_NORM / np.sqrt(self.in_features)
        self.means = (normal(self._key, _SALT_MEAN, cls, feat) * scale).astype(np.float32)

    @property
    def num_classes(self) -> int:
        """Number of classes (the width of a classifier's output layer)."""
        return self.classes

    def labels(self, indices) -> np.ndarray:
        """The int64 class label of each sample index."""
        idx = as_indices(indices, None).astype(np.uint64)
        u = uniform(self._key, _SALT_LABEL, idx)
        return np.minimum((u * self.classes).astype(np.int64), self.classes - 1)

    def get_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``indices`` as (float32 inputs ``(B, in_features)``, long targets ``(B,)``)."""
        idx = as_indices(indices, None).astype(np.uint64)
        labels = self.labels(idx)
        feat = np.arange(self.in_features, dtype=np.uint64)[None, :]
        noise = normal(self._key, _SALT_NOISE, idx[:, None], feat).astype(np.float32)
        inputs = self.means[labels] + np.float32(self.noise) * noise
        return torch.from_numpy(inputs), torch.from_numpy(labels)

    def __repr__(self) -> str:
        return (
            f"GaussianClassification(in_features={self.in_features}, classes={self.classes}, "
            f"seed={self.seed}, noise={self.noise})"
        )
