"""The planner: enumerate every plan the world allows, estimate each, choose the fastest that fits.

TorchRec's planner shape over every axis. ``enumerate_plans`` lists (dp, pp, tp) × tensor mode ×
schedule × micro-batches; ``feasible`` drops what the model or the config cannot run, with its reason;
``estimate`` prices the rest on a :class:`Topology` from one profile of the plain model; the fastest
predicted step that fits in memory wins (ties: fewer axes). This is phase one and runs before any worker
starts; phase two is ``--sparse auto`` in the workers, which decides each table on live measurements
and prints the completed plan.

    tessel plan --nproc 8 --hosts 8 --link-mbit 200            # ranked table for the default model
    tessel plan --model classifier --nproc 4 --json plan.json   # the winner, for tessel train --plan plan.json
    tessel train --nproc 4 --plan auto                          # plan, print, run the winner

In a program::

    from tessel.config import load_config
    from tessel.planner import choose, Topology
    result = choose(load_config(None, ["model.name=classifier"]), Topology(ranks=4, hosts=4, link_mbit=1000))
    print(result.table())
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..config import Config
from ..errors import ConfigError, PlanError
from ..pipeline.partition import split_text
from ..plan import ParallelPlan
from ..train.build import build, build_data
from .candidates import enumerate_plans, feasible
from .estimate import Estimate, estimate
from .profile import Profile, measure
from .topology import PARALLAX_CLUSTER, TACC_CLUSTER, Topology, from_environment

__all__ = ["Planned", "Topology", "choose", "apply", "load", "topology_of", "PARALLAX_CLUSTER", "TACC_CLUSTER"]


@dataclass
class Planned:
    ranked: list[Estimate]  # feasible candidates, fastest predicted first
    dropped: list[tuple[ParallelPlan, str]]  # infeasible candidates and why
    topology: Topology
    profile: Profile
    seconds: float  # planning time, profile included
    over_memory: list[Estimate] = field(default_factory=list)

    @property
    def best(self) -> Estimate:
        if not self.ranked:
            if self.over_memory:
                least = min(self.over_memory, key=lambda e: e.memory)
                reason = (f"the leanest ({short(least.plan)}) needs {_size(least.memory)} per rank, over the "
                          f"budget of {_size(self.topology.memory)}; give more memory or more ranks")
            else:
                reason = self.dropped[0][1] if self.dropped else "no candidate"
            raise PlanError(f"no plan fits {self.topology.ranks} ranks for this model: {reason}")
        return self.ranked[0]

    def table(self, top: int = 5, spread: int = 5) -> str:
        """The top candidates and a spread of the others, each with its predicted step and bytes."""
        rows = self.ranked[:top]
        rest = self.ranked[top:]
        if rest and spread:
            idx = sorted({round(i * (len(rest) - 1) / max(spread - 1, 1)) for i in range(min(spread, len(rest)))})
            rows += [rest[i] for i in idx]
        best = self.best.step
        lines = [self.topology.describe(),
                 f"{len(self.ranked) + len(self.over_memory) + len(self.dropped)} candidates: {len(self.ranked)} "
                 f"feasible, {len(self.over_memory)} over memory, {len(self.dropped)} refused; planned in "
                 f"{self.seconds:.1f} s (profile {self.profile.seconds:.1f} s)",
                 "",
                 f"{'#':>3}  {'plan':<44} {'step ms':>8} {'compute':>8} {'comm':>8} {'bubble':>8} {'vs best':>7}  "
                 f"{'MiB/step sent (busiest rank)':<36} {'mem MiB':>8}"]
        for e in rows:
            rank = self.ranked.index(e) + 1
            sent = " ".join(f"{c} {b / 2**20:.2f}" for c, b in e.bytes.items()) or "-"
            lines.append(f"{rank:>3}  {short(e.plan):<44} {e.step * 1e3:>8.1f} {e.compute * 1e3:>8.1f} "
                         f"{e.comm * 1e3:>8.1f} {e.bubble * 1e3:>8.1f} {e.step / best:>6.2f}x  {sent:<36} "
                         f"{e.memory / 2**20:>8.1f}")
        lines += ["", self.why()]
        return "\n".join(lines)

    def why(self) -> str:
        """Why the winner wins: what it saves against the runner-up and the plain data-parallel plan."""
        best = self.best
        out = [f"chosen: {best.plan.describe()}"]
        if best.tables:
            out.append("  tables (the workers decide again on live measurements): "
                       + ", ".join(f"{k}={v}" for k, v in best.tables.items()))
        for label, other in (("runner-up", self.ranked[1] if len(self.ranked) > 1 else None),
                             ("plain dp", next((e for e in self.ranked if e.plan.pp == e.plan.tp == 1), None))):
            if other is None or other is best:
                continue
            parts = [f"{name} {(getattr(other, name) - getattr(best, name)) * 1e3:+.1f} ms"
                     for name in ("compute", "comm", "bubble") if abs(getattr(other, name) - getattr(best, name))
                     > 0.05 * other.step]
            out.append(f"  against {label} ({short(other.plan)}, {other.step / best.step:.2f}x slower): "
                       + (", ".join(parts) or "within 5% in every part"))
        return "\n".join(out)


def _size(n: float) -> str:
    return next(f"{n / u:,.1f} {name}" for u, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))
                if n >= u or u == 1)


def short(plan: ParallelPlan) -> str:
    s = f"dp{plan.dp} pp{plan.pp} tp{plan.tp}"
    if plan.tp > 1:
        s += f" {plan.tp_mode}" + (f" {'x'.join(map(str, plan.tp_grid))}" if plan.tp_mode != "1d" else "")
    if plan.pp > 1:
        s += f" {plan.schedule}" + (f" {plan.predict}" if plan.schedule == "async-predict" else "")
    return s + f" m{plan.micro_batches}"


def _axes(plan: ParallelPlan) -> int:
    return (plan.pp > 1) + (plan.tp > 1)


# Between plans priced alike, the one that changes the math least: exact schedules, then SpecTrain's prediction
# (within noise of 1f1b at convergence, docs/pipeline.md), stashing, and stale weights last.
STALENESS = {("async-predict", "v1"): 1, ("async-predict", "v2"): 2, ("async-stash", "v1"): 3, ("async", "v1"): 4}


def _staleness(plan: ParallelPlan) -> int:
    return STALENESS.get((plan.schedule, plan.predict), 0) if plan.pp > 1 else 0


def topology_of(cfg: Config, ranks: int, measured: dict | None = None) -> Topology:
    """The topology the config and environment describe; ``measured``: a probe's latency, speed, rate and
    overlap (see :mod:`tessel.planner.probe`), which replace the defaults but not values given in ``plan.*``."""
    p = cfg.plan
    memory = p.memory_gib * 2**30 if p.memory_gib else math.inf
    topo = from_environment(ranks, p.hosts, p.link_mbit, memory=memory)
    if measured:
        topo = replace(topo, latency=measured["latency"], speed=min(topo.speed, measured["speed"]),
                       rate_mbit=measured["mbit"], overlap=measured["overlap"],
                       source=topo.source + ", latency, speed, rate and overlap measured")
    if p.latency_us:  # a given value wins over a measured one
        topo = replace(topo, latency=p.latency_us * 1e-6, source=topo.source + ", latency given")
    if p.speed:
        topo = replace(topo, speed=p.speed, source=topo.source + ", speed given")
    return topo


def choose(cfg: Config, topo: Topology, allow_async: bool | None = None, profile: Profile | None = None) -> Planned:
    """Rank every feasible plan of ``cfg``'s model on ``topo`` (the flags' degrees and schedule are ignored)."""
    t0 = time.perf_counter()
    allow = cfg.plan.allow_async if allow_async is None else allow_async
    base = copy.deepcopy(cfg)
    base.pipeline.split = ""  # the planner cuts the stages
    plans = enumerate_plans(base, topo.ranks, allow)
    vocab = getattr(build_data(base), "vocab_size", 0) if base.data_source != "gaussian" else 0

    def meta_model():
        with torch.device("meta"):
            return build(base, vocab)

    ok, dropped, seen = [], [], {}
    for plan in plans:
        # what the model allows depends only on the cut, the grid and the rows per rank: check each once
        key = (plan.pieces, plan.tp_mode, plan.tp_grid, plan.dp * plan.micro_batches, plan.schedule, plan.dp)
        if key not in seen:
            seen[key] = feasible([plan], base, meta_model())[1]
        why = seen[key] or feasible([plan], base, None, model_checked=True)[1]
        (dropped.extend if why else ok.append)(why if why else plan)
    sizes = tuple(sorted({base.train.global_batch // (p.dp * p.micro_batches) for p in ok}))
    profile = profile or measure(base, sizes=sizes or None, dps=tuple(sorted({p.dp for p in ok})))
    ests = [estimate(p, base, profile, topo) for p in ok]
    fits = [e for e in ests if e.memory <= topo.memory]
    over = [e for e in ests if e.memory > topo.memory]
    fits.sort(key=lambda e: (round(e.step, 6), _axes(e.plan), _staleness(e.plan), e.memory))
    return Planned(fits, dropped, topo, profile, time.perf_counter() - t0, over)


def apply(cfg: Config, plan: ParallelPlan) -> Config:
    """``cfg`` with the plan's degrees, tensor layout, schedule, micro-batches and stage cut, so every package
    reads the plan through the config it already reads (``ParallelPlan.from_config`` gives the plan back)."""
    out = copy.deepcopy(cfg)
    p = out.parallel
    p.dp, p.pp, p.tp = plan.dp, plan.pp, plan.tp
    p.nproc = p.nproc or plan.world
    out.tensor.mode, out.tensor.regather = plan.tp_mode, plan.regather
    out.tensor.grid = "x".join(map(str, plan.tp_grid)) if plan.tp > 1 and plan.tp_mode in ("2d", "3d") else ""
    out.tensor.sequence_parallel = plan.sequence_parallel
    out.pipeline.schedule, out.pipeline.predict = plan.schedule, plan.predict
    out.pipeline.split = split_text(plan.bounds) if plan.pp > 1 and plan.bounds else ""
    out.train.micro_batches = plan.micro_batches
    if plan.tables:
        out.sparse.tables = ",".join(f"{t.name}={t.strategy}" for t in plan.tables)
    out.plan.source = ""
    return out


def load(path: str | Path) -> ParallelPlan:
    """A plan saved by ``tessel plan --json`` (or a run's summary "plan"), checked to be one."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"plan.source '{path}' is not a file; valid: auto, or the .json a 'tessel plan --json' "
                          "wrote")
    try:
        return ParallelPlan.from_json(path.read_text())
    except (ValueError, TypeError) as e:
        raise ConfigError(f"plan file '{path}' is not a parallel plan ({e}); write one with tessel plan "
                          "--json") from None


def resolve(cfg: Config, world: int = 0) -> tuple[Config, Planned | None]:
    """The config a run follows: as given, with a saved plan applied, or with the planner's winner applied.
    ``world``: the ranks there are (0: as many as a saved plan needs, or the config's count for auto)."""
    source = cfg.plan.source
    if not source:
        return cfg, None
    if source == "auto":
        planned = choose(cfg, topology_of(cfg, world or cfg.nproc))
        return apply(cfg, planned.best.plan), planned
    plan = load(source)
    if world and plan.world != world:
        raise PlanError(f"plan file '{source}' is for {plan.world} ranks (dp={plan.dp} pp={plan.pp} tp={plan.tp}) "
                        f"but this job has {world}; run it with {plan.world} ranks or plan again for {world}")
    return apply(cfg, plan), None
