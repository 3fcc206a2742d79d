"""Datasets and the data-parallel loader.

Every dataset has ``num_samples`` (``None`` when infinite), ``vocab_size`` or ``classes``, and
``get_batch(indices) -> (inputs, targets)``, and may have ``get_targets(indices)`` where the targets cost
less alone (a pipeline's last stage reads only them); :class:`ShardedLoader` turns one into each rank's
stream of local batches.
"""

import os

from tessel.data.classify import MEAN_NORM, GaussianClassification
from tessel.data.loader import ShardedLoader
from tessel.data.text import TextDataset, prepare_text
from tessel.data.zipf import ZipfCorpus
from tessel.errors import DataError

__all__ = [
    "DATA_KINDS",
    "GaussianClassification",
    "ShardedLoader",
    "TextDataset",
    "ZipfCorpus",
    "build_dataset",
    "prepare_text",
]

DATA_KINDS = ("zipf", "text", "gaussian")
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "tessel", "text")


def build_dataset(
    kind: str,
    *,
    vocab_size: int = 8192,
    seq_len: int = 64,
    seed: int = 0,
    zipf_s: float = 1.1,
    path: str | None = None,
    cache_dir: str | None = None,
    in_features: int = 1024,
    classes: int = 100,
    separation: float = MEAN_NORM,
):
    """Build the dataset named by ``kind`` ("zipf", "text" or "gaussian") from config values.

    Arguments a kind does not use are ignored. For "text", ``path`` is a file or glob that is
    tokenized once into ``cache_dir`` (default ``~/.cache/tessel/text``); ``vocab_size`` caps the
    tokenizer, and the dataset's ``vocab_size`` is the size actually reached.

    >>> build_dataset("zipf", vocab_size=1000, seq_len=16).vocab_size
    1000
    """
    if kind == "zipf":
        return ZipfCorpus(vocab_size=vocab_size, seq_len=seq_len, s=zipf_s, seed=seed)
    if kind == "text":
        if not path:
            raise DataError("data kind 'text' needs a path; give a text file or a glob like 'data/*.txt'")
        cache = prepare_text(path, vocab_size, cache_dir or os.path.expanduser(DEFAULT_CACHE_DIR))
        return TextDataset(cache, seq_len)
    if kind == "gaussian":
        return GaussianClassification(in_features=in_features, classes=classes, seed=seed, separation=separation)
    raise DataError(f"unknown data kind {kind!r}; valid kinds: {', '.join(DATA_KINDS)}")
