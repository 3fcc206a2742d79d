"""Which rank owns which rows of a ``ps`` table, balanced for skewed (Zipf) access.

Rows go to ``p`` partitions interleaved (row r -> partition r mod p), so the most frequent ids, which
are neighbours in a frequency-ranked vocabulary, land in different partitions; partitions go to owners
greedily, heaviest first onto the least-loaded owner (Parallax's GreedyLoadBalancingStrategy, by access
count instead of bytes). ``p`` is chosen among multiples of the owner count by the load it predicts on
held-out batches: Parallax fitted t(p) = b/p + a(p-1) + c to trial runs because each TF partition was a
separate op with a fixed cost (a); here a partition costs nothing at run time, so what remains to choose
is how finely to cut without fitting the sample's noise.

    >>> plan = plan_rows(torch.tensor([50., 20, 10, 5, 3, 2, 1, 1]), torch.tensor([40., 25, 9, 6, 2, 2, 1, 0]), 2)
    >>> plan.owner.tolist(), plan.partitions, round(plan.imbalance, 2)
    ([0, 1, 1, 1, 0, 1, 1, 1], 4, 1.01)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass
class RowPlan:
    owner: torch.Tensor  # [rows] owning rank of each row
    local: torch.Tensor  # [rows] the row's index inside its owner's shard
    counts: list[int]  # rows per owner
    partitions: int
    imbalance: float  # max / mean owner load on the held-out batches (1.0 is perfect)

    def to(self, device: torch.device) -> RowPlan:
        """The same plan with its index maps on ``device``."""
        return replace(self, owner=self.owner.to(device), local=self.local.to(device))

    def rows_of(self, rank: int) -> torch.Tensor:
        """Global ids of the rows ``rank`` owns, ascending (their order in its shard)."""
        return (self.owner == rank).nonzero().squeeze(1)

    def describe(self) -> str:
        return (f"{self.partitions} partitions over {len(self.counts)} owners, {min(self.counts)}-{max(self.counts)} "
                f"rows each, load imbalance {self.imbalance:.2f} (max/mean of accesses on held-out batches)")


def _assign(freq: torch.Tensor, owners: int, p: int) -> torch.Tensor:
    rows = freq.numel()
    part_of_row = torch.arange(rows) % p
    # Each row costs its accesses plus one, so cold partitions still count by size (memory, lookups).
    load = torch.zeros(p, dtype=torch.float64).index_add_(0, part_of_row, freq.double() + 1)
    owner_load = [0.0] * owners
    owner_of_part = torch.empty(p, dtype=torch.int64)
    for part in torch.argsort(load, descending=True, stable=True).tolist():
        o = min(range(owners), key=owner_load.__getitem__)
        owner_of_part[part] = o
        owner_load[o] += float(load[part])
    return owner_of_part[part_of_row]


def _imbalance(owner: torch.Tensor, freq: torch.Tensor, owners: int) -> float:
    load = torch.zeros(owners, dtype=torch.float64).index_add_(0, owner, freq.double())
    return float(load.max() / load.mean()) if load.sum() > 0 else 1.0


def plan_rows(fit: torch.Tensor, held_out: torch.Tensor, owners: int, partitions: int = 0) -> RowPlan:
    """Owner of every row from access counts ``fit``, scored on ``held_out``; ``partitions=0`` chooses p."""
    rows = fit.numel()
    if partitions:
        candidates = [partitions]
    else:
        candidates = sorted({min(owners * 2**k, rows) for k in range(8)})
    best = None
    for p in candidates:
        owner = _assign(fit, owners, p)
        score = _imbalance(owner, held_out, owners)
        if best is None or score < best[0] - 1e-9:
            best = (score, p, owner)
    score, p, owner = best
    counts = torch.bincount(owner, minlength=owners)
    # Local index: position among the owner's rows in ascending global id.
    order = torch.argsort(owner, stable=True)
    local = torch.empty(rows, dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    local[order] = torch.arange(rows) - torch.repeat_interleave(starts, counts)
    return RowPlan(owner, local, counts.tolist(), p, score)
