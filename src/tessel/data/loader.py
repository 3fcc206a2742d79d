"""ShardedLoader: each data-parallel rank's slice of a deterministic global batch sequence.

The loader never talks to other ranks. Every rank computes the same global order of sample ids
from (seed, epoch) and takes its contiguous slice of each global batch, so concatenating the rank
batches in rank order gives exactly the batch a single process would see. That makes
data-parallel runs comparable to single-process runs sample for sample.
"""

import numpy as np
import torch

from tessel.errors import DataError

# Permutations of the epochs a batch touches are kept; two covers a batch straddling an epoch end.
_PERM_CACHE = 2
_MASK64 = (1 << 64) - 1


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise DataError(f"loader {name} {value!r} is invalid; give an int >= {low}")
    return int(value)


class ShardedLoader:
    """Iterate one rank's local batches of a dataset that has ``num_samples`` and ``get_batch``.

    Global batch ``k`` is positions ``[k * G, (k + 1) * G)`` of the sample order; rank ``r`` of
    ``P`` takes positions ``[k * G + r * G / P, k * G + (r + 1) * G / P)``. For an infinite dataset
    (``num_samples is None``) the order is the identity; for a finite one it is a fresh permutation
    per epoch seeded by ``(seed, epoch)``, and positions run on across epoch ends.

    >>> from tessel.data import ZipfCorpus
    >>> loader = ShardedLoader(ZipfCorpus(1000, 8), global_batch=8, dp_rank=1, dp_size=2)
    >>> inputs, targets = next(loader)
    >>> tuple(inputs.shape), loader.position
    ((4, 8), 1)
    """

    def __init__(
        self, dataset, global_batch: int, dp_rank: int, dp_size: int, seed: int = 0, shuffle: bool = True
    ):
        self.global_batch = _int("global_batch", global_batch, 1)
        self.dp_size = _int("dp_size", dp_size, 1)
        self.dp_rank = _int("dp_rank", dp_rank, 0)
        if self.dp_rank >= self.dp_size:
            raise DataError(f"loader dp_rank {dp_rank} is out of range; give 0 <= dp_rank < dp={dp_size}")
        if self.global_batch % self.dp_size:
            raise DataError(
                f"global batch {global_batch} is not divisible by dp={dp_size}; use a multiple of {dp_size}"
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise DataError(f"loader seed {seed!r} is not an integer; give an int such as 0")
        self.dataset = dataset
        self.local_batch = self.global_batch // self.dp_size
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.num_samples = dataset.num_samples
        if self.num_samples is not None and self.num_samples < 1:
            raise DataError(f"dataset has {self.num_samples} samples; give one with at least one sample")
        self.position = 0
        self._perms: dict[int, np.ndarray] = {}
        self._peeked: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            # Seeding with the (seed, epoch) pair, not seed + epoch, keeps seed 1 epoch 0 and
            # seed 0 epoch 1 apart; the mask maps negative seeds to distinct non-negative ones.
            rng = np.random.default_rng([self.seed & _MASK64, epoch])
            perm = rng.permutation(self.num_samples)
            if len(self._perms) >= _PERM_CACHE:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = perm
        return perm

    def sample_ids(self, step: int) -> np.ndarray:
        """The dataset indices this rank reads at global batch ``step`` (int64, length local_batch)."""
        start = step * self.global_batch + self.dp_rank * self.local_batch
        positions = np.arange(start, start + self.local_batch, dtype=np.int64)
        if self.num_samples is None:
            return positions
        if not self.shuffle:
            return positions % self.num_samples
        epochs, offsets = np.divmod(positions, self.num_samples)
        ids = np.empty_like(positions)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            ids[mask] = self._order(int(epoch))[offsets[mask]]
        return ids

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, targets) for the current global batch; then advance by one batch."""
        batch = self.peek()
        self.position += 1
        return batch

    def next_targets(self) -> torch.Tensor:
        """This rank's targets alone for the current global batch (a pipeline's last stage reads no inputs);
        then advance. A dataset with ``get_targets`` skips building the inputs (a classifier's features cost
        hundreds of times its labels)."""
        if self._peeked is not None and self._peeked[0] == self.position:
            targets = self._peeked[1][1]
        elif hasattr(self.dataset, "get_targets"):
            targets = self.dataset.get_targets(self.sample_ids(self.position))
        else:
            targets = self.peek()[1]
        self.position += 1
        return targets

    def skip(self) -> None:
        """Advance by one batch without reading it (a pipeline's middle stages never use the batch)."""
        self.position += 1

    def peek(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch ``next_batch`` will return, without advancing (read once, kept until then)."""
        if self._peeked is None or self._peeked[0] != self.position:
            self._peeked = (self.position, self.dataset.get_batch(self.sample_ids(self.position)))
        return self._peeked[1]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    @property
    def epoch(self) -> float:
        """Epochs consumed so far as a fraction (always 0.0 for an infinite dataset)."""
        if self.num_samples is None:
            return 0.0
        return self.position * self.global_batch / self.num_samples

    def state_dict(self) -> dict:
        """Resumable position: ``{"position", "dp_size", "global_batch"}``."""
        return {"position": self.position, "dp_size": self.dp_size, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`. The global batch must match this run's; the dp size may differ (a job
        re-formed on fewer hosts): a position counts global batches, which every dp size splits without
        skipping or repeating a sample."""
        missing = [k for k in ("position", "dp_size", "global_batch") if k not in state]
        if missing:
            raise DataError(
                f"data state lacks {', '.join(missing)}; give a dict from ShardedLoader.state_dict()"
            )
        if state["global_batch"] != self.global_batch:
            raise DataError(
                f"data position was saved with global batch {state['global_batch']}; this run has "
                f"{self.global_batch}; resume with --batch {state['global_batch']}"
            )
        self.position = _int("position", state["position"], 0)

    def __repr__(self) -> str:
        return (
            f"ShardedLoader({self.dataset!r}, global_batch={self.global_batch}, dp_rank={self.dp_rank}, "
            f"dp_size={self.dp_size}, position={self.position})"
        )
