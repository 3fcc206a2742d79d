"""Decide each table's strategy: given, forced (shared or unsupported tables stay dense), or ``auto``.

``auto`` follows TorchRec's planner in miniature: enumerate the options of every table, estimate
each with :mod:`tessel.sparse.cost` from the measured sparsity and the probed link, propose the
cheapest, and print the plan. Every rank must build the same tables, so the statistics are averaged
over ranks and rank 0's decisions are the ones used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .. import choices, comm
from ..choices import TableStrategy
from .cost import Estimate, Link, Sparsity, choose, estimate, format_plan, probe
from .detect import TableInfo, unsupported

AUTO_OPTIONS = ("dense", "allgather", "ps", "alltoall")


@dataclass
class Choice:
    info: TableInfo
    strategy: TableStrategy
    why: str
    split: str = ""  # alltoall: column | row
    estimates: dict[str, Estimate] = field(default_factory=dict)

    def describe_plan(self) -> str:
        chosen = f"{self.strategy.name}/{self.split}" if self.split else self.strategy.name
        return format_plan(self.estimates, chosen) if self.estimates else ""


def forced(info: TableInfo, module: nn.Module, strategy: TableStrategy, override: TableStrategy | None,
           max_touched: float) -> Choice | None:
    """The choice when nothing needs estimating, or None (``auto`` decides)."""
    dense = choices.table_strategy("dense")
    if override is not None:
        if not override.decides:
            return Choice(info, override, "given")
        strategy = override  # auto for this table
    elif not strategy.served and not strategy.decides:  # dense, or torch DDP's sparse gradients
        return Choice(info, strategy, "given for all tables")
    if info.shared_with:
        return Choice(info, dense, f"weight shared with {', '.join(info.shared_with)}: every row gets a gradient")
    if why := info.unsupported or unsupported(module):
        return Choice(info, dense, why)
    if strategy.decides:
        return None  # the cost model weighs density itself
    if info.touched > max_touched:
        return Choice(info, dense, f"a step touches more than {max_touched:.0%} of its rows")
    return Choice(info, strategy, "sparse")


def global_counts(info: TableInfo, group) -> tuple[torch.Tensor, torch.Tensor]:
    """Access counts of the first and last sample batch summed over all ranks (one owner map for all)."""
    fit, held = info.counts[0].clone(), info.counts[-1].clone()
    if dist.is_initialized():
        comm.all_reduce(fit, "sparse.plan", group=group)
        comm.all_reduce(held, "sparse.plan", group=group)
    return fit, held


def sparsity(info: TableInfo, fit: torch.Tensor, group, local_group=None) -> Sparsity:
    """Per-step sparsity of ``info`` averaged over the ranks of ``group``."""
    n = dist.get_world_size(group)
    mine = info.counts[0] > 0
    nxt = info.counts[1] > 0 if len(info.counts) > 1 else mine
    late = float((nxt & (fit > 0)).sum()) / max(float(nxt.sum()), 1.0)
    stats = torch.tensor([info.unique_per_step, late], dtype=torch.float64)
    comm.all_reduce(stats, "sparse.plan", group=group)
    u_host = float(mine.sum())
    if local_group is not None:
        host = info.counts[0].clone()
        comm.all_reduce(host, "sparse.plan", group=local_group)
        u_host = float((host > 0).sum())
    w = info.bytes // max(info.rows * info.dim, 1)
    return Sparsity(rows=info.rows, dim=info.dim, elem=w, k=float(stats[0]) / n, u=float((fit > 0).sum()),
                    u_host=u_host, late=float(stats[1]) / n, fed=info.fed)


def fetched_ahead(info, prefetch_all: bool) -> bool:
    """Whether a scheduled column-split ``alltoall`` table (``info``: a TableInfo or the planner's TableProfile) is
    fetched a step ahead: the input table always; any other whose ids begin with a batch tensor (a sampled softmax's,
    with its targets) only if asked (``prefetch_all``): its extra bookkeeping costs more than it hides on hosts whose
    CPU binds (docs/benchmarks.md)."""
    return info.fed or (info.ahead is not None and prefetch_all)


def follows(info, picked: dict, schedule: bool, prefetch_all: bool) -> bool:
    """Whether ``info`` takes its route from the table it reads the same ids after (``route_from``): that one is
    split by columns (``picked``: table -> (option, its info)) and neither is fetched ahead (a fetch ahead keeps its
    route to itself)."""
    before = picked.get(info.route_from or "")
    if before is None or before[0] != "alltoall/column":
        return False
    return not any(schedule and fetched_ahead(i, prefetch_all) for i in (info, before[1]))


def decide_auto(pending: list[tuple[TableInfo, torch.Tensor]], group, hosts: int, layout, compute: float,
                link_mbit: float, schedule: bool, split: str, dtype=torch.float32,
                prefetch_all: bool = False) -> tuple[list[Choice], Link]:
    """Choices for the tables ``auto`` decides (each with its global access counts), from the cost model."""
    n = dist.get_world_size(group)
    link = probe(group, link_mbit, dtype=dtype)
    out, picked = [], {}
    for info, fit in pending:
        s = sparsity(info, fit, group, layout[0] if layout else None)
        s.follows = follows(info, picked, schedule, prefetch_all)
        est = estimate(s, n, hosts, link, compute, schedule, local_aggregation=layout is not None)
        if split != "auto":
            # options with a split ("alltoall/column") keep the asked one; the others carry none
            est = {o: e for o, e in est.items() if o.partition("/")[2] in ("", split)}
        best = choose(est, AUTO_OPTIONS)
        picked[info.name] = (best, info)
        strategy, _, how = best.partition("/")  # the cost model's options: dense, ps, ..., alltoall/column
        out.append(Choice(info, choices.table_strategy(strategy), f"cost model, link {link.rate * 8 / 1e6:.0f} "
                          f"Mbit/s ({link.source})", how, est))
    # Floating-point sums may differ in the last bit between ranks; rank 0's plan is everyone's.
    picked = comm.all_gather_object([(c.strategy.name, c.split) for c in out], "sparse.plan", group)[0]
    for c, (strategy, how) in zip(out, picked):
        c.strategy, c.split = choices.table_strategy(strategy), how
    return out, link
