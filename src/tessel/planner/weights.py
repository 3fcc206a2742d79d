"""What one rank holds of a model's weights and outputs under a plan, per chain layer: its tensor-parallel shard,
a weight two layers of a stage share (a tied one) once, and the tables served by rows apart from the dense weights.
Both the step's estimate (:mod:`.estimate`, what the dense sync sends) and the memory's (:mod:`.memory`) count
from here."""

from __future__ import annotations

from ..plan import ParallelPlan
from .profile import Profile
from .shards import first_use


def out_share(profile: Profile, plan: ParallelPlan) -> list[float]:
    """Per layer, the share of its output one rank sends across a stage boundary (its tp block)."""
    if plan.tp == 1:
        return [1.0] * len(profile.layers)
    return profile.shard_out(plan.tp_mode, plan.tp_grid)


def table_parts(profile: Profile, plan: ParallelPlan, name: str) -> int:
    """Blocks a table's rows are cut into on this plan (1-D tp: the token table by tp; a sampled head stays whole)."""
    if plan.tp == 1:
        return 1
    return profile.tp_layers(plan.tp_mode, plan.tp_grid).table_parts.get(name, plan.tp)


def served(profile: Profile, plan: ParallelPlan, layer, names: set[str]) -> float:
    """Elements of ``layer``'s tables that are served by rows (``names``): one rank's block of each, kept outside
    the dense weights."""
    return sum(t.rows * t.dim / table_parts(profile, plan, t.name) for t in profile.tables
               if t.name in names and t.name in layer.tables)


def dense(profile: Profile, plan: ParallelPlan, lo: int, hi: int, names: set[str]) -> list[float]:
    """Per layer of ``lo..hi`` (one stage), the dense weight elements one rank holds and its sync sums: the
    layer's parameters (a tensor-parallel shard's, replicated pieces whole), a weight an earlier layer of the
    stage also uses (a tied one) counted there only, less the tables served by rows (``names``)."""
    held = first_use(profile.param_sizes(plan.tp_mode, plan.tp_grid)[lo:hi])
    return [sum(n for _, n in named) - served(profile, plan, layer, names)
            for layer, named in zip(profile.layers[lo:hi], held)]


def tied(profile: Profile, plan: ParallelPlan, bounds) -> list[list[tuple[float, int]]]:
    """Per stage, (elements, stages holding it) of each weight it shares with another stage (a token table tied to
    the head on the last): every stage keeps a copy and their gradients are summed once a step
    (tessel.pipeline.layers.ties)."""
    sizes = profile.param_sizes(plan.tp_mode, plan.tp_grid)
    where: dict[str, set[int]] = {}
    size: dict[str, int] = {}
    for k, (lo, hi) in enumerate(bounds):
        for named in sizes[lo:hi]:
            for name, n in named:
                where.setdefault(name, set()).add(k)
                size[name] = n
    return [[(size[name], len(ks)) for name, ks in where.items() if k in ks and len(ks) > 1]
            for k in range(len(bounds))]
