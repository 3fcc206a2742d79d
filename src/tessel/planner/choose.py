"""The planner's choice: every candidate of :mod:`.candidates` priced by :mod:`.estimate` on one profile, the
fastest predicted step that fits in memory first (ties: fewer axes, then the schedule that changes the math
least), printed as a ranked table with why the winner wins."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from ..errors import PlanError
from ..meta import on_meta
from ..plan import ParallelPlan
from .candidates import enumerate_plans, feasible
from .estimate import Estimate, estimate
from .job import Job
from .profile import Profile, measure
from .topology import Topology


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
                least = min(self.over_memory, key=lambda e: e.needs)
                topo = self.topology
                kept, hint = ((f" less the {topo.headroom:.0%} kept free ({_size(topo.budget)})",
                               ", or a smaller plan.memory_headroom") if topo.headroom else ("", ""))
                beside = f" ({_size(least.held)} of it beside its tensors, FSDP's units)" if least.held else ""
                reason = (f"the leanest ({short(least.plan)}) needs {_size(least.needs)} per rank{beside}, over the "
                          f"budget of {_size(topo.memory)}{kept}; give more memory or more ranks{hint}")
            else:  # each way of cutting the world refused, once (up to three)
                reason = "; ".join(list(dict.fromkeys(why for _, why in self.dropped))[:3]) or "no candidate"
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
                 f"{'MiB/step sent (busiest rank)':<36} {'mem MiB':>8} {'calls':>6}"]
        for e in rows:
            rank = self.ranked.index(e) + 1
            sent = " ".join(f"{c} {b / 2**20:.2f}" for c, b in e.bytes.items()) or "-"
            lines.append(f"{rank:>3}  {short(e.plan):<44} {e.step * 1e3:>8.1f} {e.compute * 1e3:>8.1f} "
                         f"{e.comm * 1e3:>8.1f} {e.bubble * 1e3:>8.1f} {e.step / best:>6.2f}x  {sent:<36} "
                         f"{e.needs / 2**20:>8.1f} {sum(e.calls.values()):>6.0f}")
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
    s = f"dp{plan.dp}" + (f" fsdp{plan.dp_shard}" if plan.dp_shard > 1 else "") + f" pp{plan.pp} tp{plan.tp}"
    if plan.tp > 1:
        s += f" {plan.tp_mode.name}" + (f" {'x'.join(map(str, plan.tp_grid))}" if plan.tp_mode.needs_grid else "")
    if plan.pp > 1:
        s += f" {plan.schedule.name}" + (f" {plan.predict.name}" if plan.schedule.weights == "predict" else "")
    return s + f" m{plan.micro_batches}" + (f" recompute-{plan.recompute.name}" if plan.recompute.layers else "")


def _axes(plan: ParallelPlan) -> int:
    return (plan.pp > 1) + (plan.tp > 1)


def _staleness(plan: ParallelPlan) -> int:
    """Between plans priced alike, the one that changes the math least: exact schedules, then SpecTrain's
    prediction (within noise of 1f1b at convergence, docs/pipeline.md), stashing, and stale weights last."""
    if plan.pp == 1:
        return 0
    return plan.schedule.staleness + (plan.predict.staleness if plan.schedule.weights == "predict" else 0)


def choose(job: Job, topo: Topology, allow_async: bool = False, profile: Profile | None = None) -> Planned:
    """Rank every feasible plan of ``job``'s model on ``topo``; ``allow_async``: also the schedules that change the
    math (async, async-stash, async-predict)."""
    t0 = time.perf_counter()
    settings = job.settings
    plans = enumerate_plans(job.base, topo.ranks, settings.global_batch, allow_async)

    built = []

    def meta_model():  # a fresh copy for each check, which changes it (a copy costs half a build)
        if not built:
            with on_meta():
                built.append(job.build())
        try:
            return copy.deepcopy(built[0])
        except (TypeError, RuntimeError, copy.Error):  # a model holding what cannot be copied: build it again
            with on_meta():
                return job.build()

    ok, dropped = feasible(plans, settings, meta_model)
    sizes = tuple(sorted({settings.global_batch // (p.dp * p.micro_batches) for p in ok}))
    profile = profile or measure(job, sizes=sizes or None, dps=tuple(sorted({p.dp for p in ok})))
    ests = [estimate(p, settings, profile, topo) for p in ok]
    fits = [e for e in ests if e.needs <= topo.budget]
    over = [e for e in ests if e.needs > topo.budget]
    fits.sort(key=lambda e: (round(e.step, 6), _axes(e.plan), _staleness(e.plan), e.needs))
    return Planned(fits, dropped, topo, profile, time.perf_counter() - t0, over)


