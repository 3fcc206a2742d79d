"""ZipfCorpus: an embedded, infinite word-level corpus with realistic token sparsity.

Real text has Zipf-distributed word frequencies: a handful of ids appear in almost every batch and
most of the vocabulary is touched rarely. That sparsity is what sparse embedding gradients exploit,
so a synthetic corpus has to reproduce it. On top of the unigram law each token has a few fixed
likely successors, which gives a language model bigram structure to learn (its loss can fall well
below the unigram entropy).
"""

import numpy as np
import torch

from tessel.data._counter import as_indices, seed_key, uniform
from tessel.errors import DataError

MAX_VOCAB = 1 << 24
# Probability that a token is one of its predecessor's fixed successors rather than a fresh draw.
FOLLOW_PROB = 0.75
# Fixed successors per token, chosen with Zipf(1) weights so the first is the most likely.
NUM_SUCCESSORS = 8

# Salts keep the independent random streams of one (doc, position) apart.
_SALT_FRESH = np.uint64(1)
_SALT_FOLLOW = np.uint64(2)
_SALT_CHOICE = np.uint64(3)
_SALT_SUCCESSOR = np.uint64(4)


def _zipf_cdf(n: int, s: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    # Rounding can leave the last entry a hair below 1; a u close to 1 must still map to the last id.
    cdf[-1] = 1.0
    return cdf


class ZipfCorpus:
    """Infinite corpus of documents of ``seq_len + 1`` tokens with Zipf unigram and bigram structure.

    Token id = frequency rank: id ``r`` has unigram probability proportional to ``1 / (r + 1) ** s``.
    With probability 0.75 a token is instead one of its predecessor's 8 fixed successors (themselves
    Zipf draws, so the marginal stays Zipf-like in expectation). Document ``i`` is a pure function
    of ``(seed, i)``, so any set of indices can be generated in one call, on any rank.

    >>> corpus = ZipfCorpus(vocab_size=1000, seq_len=8)
    >>> inputs, targets = corpus.get_batch(np.arange(4))
    >>> tuple(inputs.shape), bool((inputs[:, 1:] == targets[:, :-1]).all())
    ((4, 8), True)
    """

    num_samples = None

    def __init__(self, vocab_size: int = 8192, seq_len: int = 64, s: float = 1.1, seed: int = 0):
        if (
            isinstance(vocab_size, bool)
            or not isinstance(vocab_size, (int, np.integer))
            or not (16 <= vocab_size <= MAX_VOCAB)
        ):
            raise DataError(f"zipf vocab_size {vocab_size!r} is invalid; give an int from 16 to {MAX_VOCAB}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 2:
            raise DataError(f"zipf seq_len {seq_len!r} is invalid; give an int >= 2")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0 < s < float("inf")):
            raise DataError(f"zipf exponent s={s!r} is invalid; give a finite number > 0 (text is near 1.1)")
        self.vocab_size = int(vocab_size)
        self.seq_len = int(seq_len)
        self.s = float(s)
        self.seed = seed
        self._key = seed_key(seed)
        self._cdf = _zipf_cdf(self.vocab_size, self.s)
        self._choice_cdf = _zipf_cdf(NUM_SUCCESSORS, 1.0)

    def _unigram(self, u: np.ndarray) -> np.ndarray:
        ids = np.searchsorted(self._cdf, u, side="right")
        return np.minimum(ids, self.vocab_size - 1)

    def successor(self, prev: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The ``k``-th fixed successor of each token in ``prev`` (a deterministic Zipf draw)."""
        prev = np.asarray(prev, dtype=np.uint64)
        k = np.asarray(k, dtype=np.uint64)
        return self._unigram(uniform(self._key, _SALT_SUCCESSOR, prev, k))

    def tokens(self, indices) -> np.ndarray:
        """The int64 token array of shape ``(len(indices), seq_len + 1)`` for the given documents."""
        docs = as_indices(indices, None).astype(np.uint64)[:, None]
        pos = np.arange(self.seq_len + 1, dtype=np.uint64)[None, :]
        # Everything that does not depend on the previous token is drawn up front for all positions.
        tokens = self._unigram(uniform(self._key, _SALT_FRESH, docs, pos)).astype(np.int64)
        follow = uniform(self._key, _SALT_FOLLOW, docs, pos) < FOLLOW_PROB
        choice = np.searchsorted(self._choice_cdf, uniform(self._key, _SALT_CHOICE, docs, pos), side="right")
        follow[:, 0] = False  # a document's first token has no predecessor
        # A following token is its predecessor's successor, so it is known once the one before it is: resolve
        # by depth (positions since the last fresh draw), one vectorised step per depth. The longest run of
        # followers is ~log(positions) / log(1 / 0.75), tens, where a loop over positions runs seq_len steps
        # (76 ms a GPT-2-sized batch, longer than the GPU's step). Each token is computed exactly as in order.
        cols = np.arange(follow.shape[1])
        depth = (cols - np.maximum.accumulate(np.where(follow, 0, cols), axis=1)).ravel()
        flat, choice = tokens.reshape(-1), choice.reshape(-1)  # flat is a view: writes land in tokens
        order = np.argsort(depth, kind="stable")
        ends = np.cumsum(np.bincount(depth))
        for d in range(1, len(ends)):
            at = order[ends[d - 1]:ends[d]]  # positions d steps after a fresh token; at - 1 is one step less
            flat[at] = self.successor(flat[at - 1], choice[at])
        return tokens

    def get_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Documents ``indices`` as (inputs, targets) long tensors of shape ``(B, seq_len)``.

        Targets are inputs shifted by one token: ``targets[:, t]`` is the token after ``inputs[:, t]``.
        """
        tokens = self.tokens(indices)
        inputs = torch.from_numpy(np.ascontiguousarray(tokens[:, :-1]))
        targets = torch.from_numpy(np.ascontiguousarray(tokens[:, 1:]))
        return inputs, targets

    def __repr__(self) -> str:
        args = f"vocab_size={self.vocab_size}, seq_len={self.seq_len}, s={self.s}, seed={self.seed}"
        return f"ZipfCorpus({args})"
