"""The hardware a plan is made for: ranks, hosts, links, compute speed and memory, as one frozen record.

Every estimate the planner makes reads its rates from a :class:`Topology`. It comes from the command line
(``tessel plan --hosts 8 --link-mbit 200``), from the emulated cluster's environment (``TESSEL_LINK_MBIT``
for the shaped link, ``TESSEL_HOST_CPUS`` for each host's CPU budget, both set by ``tessel cluster run``), or
from defaults for one machine. Ranks fill hosts in order, so the innermost mesh dim (tp) is the closest.

    >>> t = Topology(ranks=8, hosts=4, link_mbit=200)
    >>> t.per_host, t.spans_hosts(size=2, stride=1), t.spans_hosts(size=2, stride=2)
    (2, False, True)
    >>> round(t.group_rate(size=4, stride=1) / 1e6, 1)  # bytes/s: one rank per host sends on its 200 Mbit/s link
    25.0
    >>> round(t.group_rate(size=4, stride=2) / 1e6, 1)  # both ranks of a host send across it: half each
    12.5
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ConfigError
from ..sparse.cost import env_link_mbit

LOOPBACK_MBIT = 8000.0  # gloo over loopback on this kind of machine: CPU-bound, about 1 GB/s per rank pair
LOCAL_MBIT = 8000.0  # between ranks of one host (shared memory / loopback)
CPU_UNIT_MEMORY = 0.68 * 2**20  # Topology.unit_memory on the CPU (measured there)


@dataclass(frozen=True)
class Topology:
    ranks: int
    hosts: int = 1
    link_mbit: float = LOOPBACK_MBIT  # each host's link to the others (Mbit/s, one direction)
    local_mbit: float = LOCAL_MBIT  # between ranks of one host
    latency: float = 200e-6  # seconds per ring step of a collective (gloo over TCP here)
    # seconds per ring step of a one-element all-reduce (a loss, a norm), which gloo reduces by a cheaper path than
    # any larger tensor: 1 or 2 fp32 elements took a quarter to a tenth of 8 or more on the emulated hosts
    # (bench/plan-latency/calls.txt; measured by the probe; 0: ``latency``)
    tiny_latency: float = 0.0
    speed: float = 1.0  # compute speed of a rank relative to one core of this machine (0.5: half a core)
    memory: float = math.inf  # bytes a rank may hold
    headroom: float = 0.0  # share of ``memory`` the planner leaves free (its picks are held to ``budget``)
    # Mbit/s one rank moves collective bytes at, whatever the wire: gloo copies and reduces on the rank's own
    # CPU, so under a CPU quota a fast link is not filled (measured by tessel.planner.probe; inf: not measured)
    rate_mbit: float = math.inf
    # share of an asynchronous collective that hides behind compute running beside it (measured by the probe;
    # under a tight CPU quota gloo's threads and the compute take turns, so little hides)
    overlap: float = 1.0
    # seconds each micro-batch beyond the first adds to a step beyond its layers' work (autograd set-up, the loss,
    # the runtime's bookkeeping), measured by a calibration trial (tessel.planner.calibrate; None: not measured,
    # the profile's is priced; a trial's 0 is a measurement)
    per_micro: float | None = None
    # bytes a worker holds beside its tensors for each FSDP unit it runs, where that counts against a rank's
    # memory: on the CPU (the host's memory), where 8 local ranks of the memory benchmark's Transformer LM held
    # 0.68 MiB more of the rest per unit (330 MiB at 2 layers, 344 at 23; bench/local-probes); 0 on a GPU, where
    # it is host memory, not the device's
    unit_memory: float = 0.0
    # what a call costs after compute beyond its back-to-back time, measured by the probe
    # (tessel.planner.probe.wait_after): ((group size, a core's seconds of compute before the call, seconds), ...).
    # Under a CPU quota it grows with the compute since the group last synchronized and with the group (a host's
    # unused budget is lost at each period's end while it waits for a throttled peer). Empty: not measured, none
    wait_points: tuple[tuple[int, float, float], ...] = ()
    # a core's seconds per CFS period a host's CPU group allows (measured by the probe: tessel.planner.probe.cpu_quota;
    # 0: no quota): a host that has idled runs that much at a whole core before the quota throttles it
    quota: float = 0.0
    # the rates FSDP's all-gather and reduce-scatter move at, measured by the probe per group size
    # (tessel.planner.probe.fsdp_rates): ((group size, gather Mbit/s, reduce-scatter Mbit/s), ...); on gloo neither
    # moves at the all-reduce's rate (``rate_mbit``). Empty: not measured, FSDP's calls at the group's rate
    fsdp_points: tuple[tuple[int, float, float], ...] = ()
    # bytes a link between hosts passes at once after idling, beyond its rate (measured by the probe:
    # tessel.planner.probe.link_burst; 0: none): a shaped link's token bucket, which a pipeline's first activation
    # and its gradient cross after their stage idled
    link_burst: float = 0.0
    source: str = "defaults"

    def __post_init__(self) -> None:
        for key in ("link_mbit", "local_mbit", "speed", "memory", "rate_mbit"):
            v = getattr(self, key)
            if not (v > 0 and not math.isnan(v)) or (key not in ("memory", "rate_mbit") and not math.isfinite(v)):
                raise ConfigError(f"topology {key.replace('_', '-')} is {v}; it must be a positive finite number")
        if not (isinstance(self.ranks, int) and isinstance(self.hosts, int) and 1 <= self.hosts <= self.ranks
                and self.ranks % self.hosts == 0):
            raise ConfigError(f"topology of {self.ranks} ranks on {self.hosts} hosts is invalid; hosts must divide "
                              "the ranks (each host holds the same number)")
        if not 0 <= self.headroom < 1:
            raise ConfigError(f"topology headroom is {self.headroom}; it must be a share from 0 to below 1")
        if not 0 <= self.overlap <= 1:
            raise ConfigError(f"topology overlap is {self.overlap}; it must be a share from 0 to 1")
        if not all(isinstance(g, int) and g >= 2 and math.isfinite(c) and c >= 0 and math.isfinite(v) and v >= 0
                   for g, c, v in self.wait_points):
            raise ConfigError(f"topology wait points are {self.wait_points}; each must be (group size >= 2, compute "
                              "seconds >= 0, seconds >= 0)")
        if not all(isinstance(g, int) and g >= 2 and a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)
                   for g, a, b in self.fsdp_points):
            raise ConfigError(f"topology fsdp points are {self.fsdp_points}; each must be (group size >= 2, gather "
                              "Mbit/s > 0, reduce-scatter Mbit/s > 0)")
        for key in ("latency", "tiny_latency", "per_micro", "unit_memory", "quota", "link_burst"):
            v = getattr(self, key)
            if v is None and key == "per_micro":
                continue
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"topology {key.replace('_', '-')} is {v}; it must be a finite number >= 0")

    @property
    def budget(self) -> float:
        """Bytes a rank's plan may be predicted to hold: its memory less the headroom."""
        return self.memory * (1 - self.headroom)

    @property
    def per_host(self) -> int:
        return self.ranks // self.hosts

    def spans_hosts(self, size: int, stride: int) -> bool:
        """Whether a group of ``size`` ranks ``stride`` apart (a mesh dim) crosses a host boundary."""
        return size > 1 and size * stride > self.per_host

    def group_rate(self, size: int, stride: int) -> float:
        """Bytes/s one rank of such a group sends at: the host link is shared by the host's ranks that send
        across it at the same time (all of them for a dim whose groups each span hosts), and no rank sends
        faster than its CPU moves bytes (``rate_mbit``)."""
        if not self.spans_hosts(size, stride):
            return min(self.local_mbit, self.rate_mbit) * 1e6 / 8
        sharing = min(stride, self.per_host)
        return min(self.link_mbit / sharing, self.rate_mbit) * 1e6 / 8

    def fsdp_rate(self, size: int, stride: int, kind: str) -> float:
        """Bytes/s one rank of an FSDP shard group sends at in its ``kind`` ("gather" or "scatter") calls: the
        group's rate (:meth:`group_rate`), capped by what the probe measured that collective to move at in groups of
        that size (``fsdp_points``: linear between the sizes measured, the nearest where outside them).

        >>> t = Topology(ranks=8, hosts=8, link_mbit=1000, fsdp_points=((2, 600.0, 500.0), (8, 900.0, 700.0)))
        >>> t.fsdp_rate(2, 1, "gather") * 8 / 1e6, round(t.fsdp_rate(4, 1, "scatter") * 8 / 1e6, 6)
        (600.0, 566.666667)
        >>> Topology(ranks=8, hosts=8, link_mbit=1000).fsdp_rate(2, 1, "gather") * 8 / 1e6  # not measured
        1000.0
        """
        rate = self.group_rate(size, stride)
        if not self.fsdp_points:
            return rate
        at = {g: gather if kind == "gather" else scatter for g, gather, scatter in self.fsdp_points}
        return min(rate, _across_sizes(at, size, at.get) * 1e6 / 8)

    @property
    def tiny_step(self) -> float:
        """Seconds per ring step of a one-element all-reduce: the tiny latency where one was measured, else the
        latency."""
        return self.tiny_latency or self.latency

    def call_seconds(self, nbytes: float, calls: float, steps: float, rate: float, tiny: bool = False) -> float:
        """Seconds of ``calls`` like collectives that send ``nbytes`` in all from a rank at ``rate`` bytes/s over
        ``steps`` ring steps: the longer of the bytes' transfer and the ring steps' latency, not their sum (gloo's
        work for a ring step, most of a step's latency under a CPU quota, goes on while the bytes travel: on the
        emulated hosts a 64 KiB all-reduce took what a 4 KiB one did until its bytes took longer, bench/plan-latency).
        ``tiny``: one-element calls (a loss, a norm), whose steps pay the tiny latency where one was measured.
        (Calls of unequal sizes priced together get the longer of their sums, which is at most the sum of each
        call's own: the estimate groups like calls, and FSDP's units and DDP's buckets are taken as equal.)

        >>> t = Topology(ranks=4, latency=1e-3, tiny_latency=1e-4)
        >>> t.call_seconds(4096, calls=1, steps=6, rate=1e8) * 1e3  # the steps' latency is the longer
        6.0
        >>> round(t.call_seconds(4e6, calls=2, steps=12, rate=1e8) * 1e3, 6)  # the bytes are
        40.0
        >>> round(t.call_seconds(12, calls=1, steps=6, rate=1e8, tiny=True) * 1e3, 6)  # a loss's one element
        0.6
        """
        if calls <= 0:
            return 0.0
        return max(nbytes / rate, steps * (self.tiny_step if tiny else self.latency))

    def wait(self, size: int, calls: float, cpu: float) -> float:
        """Seconds ``calls`` collectives of a group of ``size`` ranks wait beyond their back-to-back time
        (:meth:`call_seconds`) when ``cpu`` seconds of a core's compute are spread before them, each following its
        share: the probe's measurements (``wait_points``), linear between the compute lengths it timed and held
        flat past the longest, and between the group sizes (the nearest where outside them); none where not measured.

        >>> t = Topology(ranks=8, wait_points=((2, 0.0, 0.0), (2, 0.002, 0.004), (8, 0.0, 0.0), (8, 0.002, 0.010)))
        >>> round(t.wait(2, calls=4, cpu=0.004) * 1e3, 3)  # 1 ms of compute before each call: 2 ms each
        8.0
        >>> round(t.wait(4, calls=1, cpu=0.01) * 1e3, 3)  # a third of the way from 2 to 8, past the longest burst
        6.0
        >>> Topology(ranks=8).wait(8, calls=2, cpu=0.01)  # not measured
        0.0
        """
        if size < 2 or calls <= 0 or cpu <= 0 or not self.wait_points:  # (no compute before: back to back)
            return 0.0
        return calls * _wait_at(self.wait_points, size, cpu / calls)

    def after_idle(self, seconds: float) -> float:
        """Seconds a burst of compute that takes ``seconds`` at ``speed`` takes on a host that has idled: its
        share of the quota (``quota`` over the host's ranks) at a whole core, the rest at ``speed``. A pipeline
        stage computes so while it fills and drains (its first micro-batch each way, after waiting for its
        neighbour): on the emulated hosts such bursts ran at a full core (bench/local-probes/burst-2026-12-01).

        >>> t = Topology(ranks=4, hosts=4, speed=0.5, quota=0.005)
        >>> round(t.after_idle(0.004) * 1e3, 9)  # 2 ms of a core, at once
        2.0
        >>> round(t.after_idle(0.030) * 1e3, 9)  # 15 ms of a core: 5 at once, then 10 at half a core
        25.0
        >>> Topology(ranks=4, speed=0.5).after_idle(0.004)  # no quota: the speed throughout
        0.004
        """
        budget = self.quota / self.per_host
        cpu = seconds * self.speed
        return min(cpu, budget) + max(0.0, cpu - budget) / self.speed

    def describe(self) -> str:
        mem = "unbounded" if math.isinf(self.memory) else f"{self.memory / 2**30:.1f} GiB" + (
            f" ({self.headroom:.0%} kept free)" if self.headroom else "") + (
            f", {self.unit_memory / 2**20:.2f} MiB of it beside the tensors per FSDP unit"
            if self.unit_memory and not math.isinf(self.memory) else "")
        moved = "" if math.isinf(self.rate_mbit) else (f" (a rank moves {self.rate_mbit:.0f}, {self.overlap:.0%} "
                                                      "of it hidden by compute)")
        return (f"topology: {self.ranks} ranks on {self.hosts} host{'s' if self.hosts > 1 else ''}, link "
                f"{self.link_mbit:g} Mbit/s across hosts, {self.local_mbit:g} within{moved}, latency "
                f"{self.latency * 1e6:.0f} us" + (f" ({self.tiny_latency * 1e6:.0f} us for a one-element call)"
                                                  if self.tiny_latency else "")
                + f", compute {self.speed:.3g}x one core"
                + (f" ({self.quota * 1e3:.3g} ms a CFS period at a whole core after idling)" if self.quota else "")
                + (f", a call's wait after compute measured in groups of "
                   f"{', '.join(str(g) for g in sorted({g for g, _, _ in self.wait_points}))}" if self.wait_points
                   else "")
                + (f", {self.per_micro * 1e3:.2f} ms per extra micro-batch" if self.per_micro else "")
                + (f", {self.link_burst / 1024:.0f} KiB across a link at once after idling" if self.link_burst else "")
                + f", memory per rank {mem} ({self.source})")


def _wait_at(points: tuple[tuple[int, float, float], ...], size: int, cpu: float) -> float:
    """One call's measured wait in a group of ``size`` after ``cpu`` seconds of compute (Topology.wait)."""
    def at(g: int) -> float:
        pts = sorted((c, v) for s, c, v in points if s == g)
        return float(np.interp(cpu, [c for c, _ in pts], _rising([v for _, v in pts])))
    return _across_sizes({s for s, _, _ in points}, size, at)


def _across_sizes(sizes, size: int, at) -> float:
    """``at(g)`` for a group of ``size`` ranks from the group sizes measured: linear between the two around it, the
    nearest where it lies outside them."""
    sizes = sorted(sizes)
    lo = max([g for g in sizes if g <= size], default=sizes[0])
    hi = min([g for g in sizes if g >= size], default=sizes[-1])
    return at(lo) if lo == hi else at(lo) + (at(hi) - at(lo)) * (size - lo) / (hi - lo)


def _rising(values: list[float]) -> list[float]:
    """The non-decreasing sequence nearest ``values`` (least squares, pooling adjacent violators): a mean over a few
    calls can come out lower after a longer burst than after a shorter one, which the wait cannot be."""
    blocks: list[list[float]] = []  # [sum, count] per pooled block
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return [s / n for s, n in blocks for _ in range(n)]


def wait_points(measured: dict) -> tuple[tuple[int, float, float], ...]:
    """A probe's ``wait`` measurements as :attr:`Topology.wait_points` holds them (none from a probe before
    2026-12-07's second session)."""
    return tuple((int(g), float(c), float(v)) for g, c, v in measured.get("wait", ()))


def beside_trial(topo: Topology, measured: dict) -> Topology:
    """``topo`` with what of a probe's a calibration trial does not measure (tessel.planner.probe.beside_trial; none
    from a probe before 2026-12-07's second session): the wait after compute, the hosts' quota, FSDP's rates, and
    the bytes a link passes at once after idling (none from a probe before its third session, nor beside a trial)."""
    return replace(topo, wait_points=wait_points(measured), quota=measured.get("quota", 0.0),
                   fsdp_points=tuple((int(g), float(a), float(b)) for g, a, b in measured.get("fsdp", ())),
                   link_burst=measured.get("link_burst", 0.0))


def probed(topo: Topology, measured: dict, source: str) -> Topology:
    """``topo`` with a probe's measurements (tessel.planner.probe): its loaded latencies (of a 4 KiB all-reduce's ring
    step; of a tiny one's, none from a probe before 2026-12-07), speed (at most the topology's), the rate a rank moves
    bytes at, the share of it that hides behind compute, and what the trial does not measure (:func:`beside_trial`)."""
    return beside_trial(replace(topo, latency=measured["latency"], tiny_latency=measured.get("tiny_latency", 0.0),
                          speed=min(topo.speed, measured["speed"]), rate_mbit=measured["mbit"],
                          overlap=measured["overlap"], source=source), measured)


def from_environment(ranks: int, hosts: int = 0, link_mbit: float = 0.0, cpus: float = 0.0,
                     memory: float = math.inf, headroom: float = 0.0) -> Topology:
    """The topology of this job: given values first, then the emulated cluster's environment, then one machine
    whose cores the ranks share (a rank gets at most one core: workers run one thread each)."""
    env_hosts = int(os.environ.get("GROUP_WORLD_SIZE", "0") or 0) if not hosts else 0
    hosts = hosts or (env_hosts if env_hosts and ranks % env_hosts == 0 else 1)
    given = link_mbit > 0
    link = link_mbit if given else env_link_mbit()
    source = "given" if given else "TESSEL_LINK_MBIT" if link else "defaults"
    cpus = cpus or _env_cpus()
    if cpus:
        speed = min(1.0, cpus / (ranks // hosts))
    else:
        speed = min(1.0, (os.cpu_count() or 1) / ranks) if hosts == 1 else 1.0
    return Topology(ranks=ranks, hosts=hosts, link_mbit=link or LOOPBACK_MBIT, speed=speed, memory=memory,
                    headroom=headroom, source=source)


def _env_cpus() -> float:
    text = os.environ.get("TESSEL_HOST_CPUS", "")
    try:
        v = float(text) if text else 0.0
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise ConfigError(f"TESSEL_HOST_CPUS is '{text}'; it must be a positive number of cores, or unset")
    return v


# The seeds' clusters, for projections on paper (these machines are not here to measure).
PARALLAX_CLUSTER = Topology(ranks=48, hosts=8, link_mbit=56_000, local_mbit=128_000, latency=10e-6, speed=1.0,
                            source="Parallax: 8 machines x 6 GPUs, 56 Gbit/s InfiniBand")
TACC_CLUSTER = Topology(ranks=64, hosts=16, link_mbit=100_000, local_mbit=600_000, latency=10e-6, speed=1.0,
                        source="3-D paper: 64 V100 in nodes of 4, NVLink within, 100 Gbit/s across")
