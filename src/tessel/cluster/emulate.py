"""An emulated cluster: N hosts on one machine, each with its own address, link rate and CPU budget.

On loopback, communication is nearly free (~13 Gbit/s), which hides exactly the cost tessel is about.
So each host is a Linux network namespace ``{prefix}-h{i}`` whose ``eth0`` (10.77.0.{i+1}/24) is one
end of a veth pair; the other end, ``{prefix}-s{i}``, hangs on a bridge inside a "switch" namespace
``{prefix}-sw``, so the root namespace's network is never touched. Both ends of every link are shaped
with ``tc tbf`` (and ``netem`` for delay), and each host gets a cgroup v1 cpu quota so that a host idling
in a network wait cannot lend its CPU to the others (optionally a CFS burst allowance, and a cpuset that
keeps the host on its own cores)::

    with EmulatedCluster(2, "200mbit") as c:
        c.run(c.torchrun_commands(["-m", "tessel", "train", "--steps", "5"]))

Everything is removed on exit, on error, on Ctrl-C and on SIGTERM; ``up()`` first removes what a
crashed run of the same prefix left behind (:mod:`.housekeeping` finds and removes it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import cgroups
from .cgroups import PERIOD_US, CgroupError
from .housekeeping import (
    ClusterError,
    check_machine,
    command_of,
    held_by,
    host_pids,
    kill_all,
    leftovers,
    namespaces,
    remove_cluster,
    sh,
    signals_held,
    state_file,
)

SUBNET = "10.77.0"
HOST_INTERFACE = "eth0"  # each host's one link (its namespace's other interface is lo)
QUEUE = "50ms"  # how long a packet may wait in a link's queue before tbf drops it
LAST_CALL_S = 5  # an elastic re-form on fewer hosts waits this long for the others (see torchrun_commands)
KEEP_ALIVE_S = 2  # seconds between a node's keep-alives in such a job; three missed and it is gone
_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE_FORMS = "a number of bit/s with an optional unit kbit, mbit or gbit, e.g. 500kbit, 200mbit, 1gbit, 1e6"


class HostFailed(RuntimeError):
    """A host's command failed or timed out and the others were stopped (the job failed, not the input)."""

    def __init__(self, message: str, host: int, returncode: int | None, results: list[HostResult]):
        super().__init__(message)
        self.host, self.returncode, self.results = host, returncode, results


@dataclass
class HostResult:
    """What one host's command did (the fields of subprocess.CompletedProcess plus host, seconds and whether it
    ran out of its memory limit)."""

    host: int
    args: list[str]
    returncode: int | None
    stdout: str | None
    stderr: str | None
    seconds: float
    out_of_memory: bool = False  # the kernel killed one of its processes for the host's memory limit
    peak_memory: int = 0  # the most bytes its processes held at once (under a memory limit; else 0)


MALLOC_RETURN = 128 * 2**10  # under a memory limit, C heap blocks this size or larger go back to the system at free


def parse_rate(text: str) -> float:
    """A link rate in bit/s, from tc-style text.

    >>> parse_rate("200mbit"), parse_rate("1gbit"), parse_rate("500kbit"), parse_rate("1e6")
    (200000000.0, 1000000000.0, 500000.0, 1000000.0)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*([a-z]*)\s*", str(text).lower())
    if not m or m.group(2) not in _UNITS or not 0 < float(m.group(1)) < math.inf:  # 1e400 reads as inf
        # "mbps" means megabytes/s to tc; accepting it would silently give 8x the intended rate.
        raise ClusterError(f"rate {text!r} is not understood; use {_RATE_FORMS}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_size(text: str) -> float:
    """A size in bytes from '4GiB', '512MiB', '2.5GB' or a byte count; NaN where it is none.

    >>> parse_size("512MiB"), parse_size("2GB"), parse_size("lots")
    (536870912.0, 2000000000.0, nan)
    """
    units = {"gib": 2**30, "gb": 1e9, "mib": 2**20, "mb": 1e6, "kib": 2**10, "kb": 1e3, "b": 1}
    low = text.strip().lower()
    unit = next((u for u in units if low.endswith(u)), "b")
    try:
        return float(low[: len(low) - len(unit)] if low.endswith(unit) else low) * units[unit]
    except ValueError:
        return math.nan


def parse_delay(text: str) -> float:
    """A one-way delay in seconds, from text like ``"5ms"``, ``"200us"``, ``"0.1s"`` or ``"0"``.

    >>> parse_delay("5ms"), parse_delay("0")
    (0.005, 0.0)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(us|ms|s)?\s*", str(text).lower())
    if not m:
        raise ClusterError(f"delay {text!r} is not understood; use a number with unit us, ms or s, e.g. 5ms")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-3}[m.group(2)]


def _read_back(f) -> str | None:
    if f is not None:
        with f:
            f.seek(0)
            return f.read().decode(errors="replace")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class EmulatedCluster:
    """N emulated hosts; a context manager that builds them on entry and removes them on exit.

    ``rate`` shapes each host's link in both directions (``None``: unshaped, for compute-only runs);
    ``delay`` is the one-way host-to-host latency (half of it on each end of a link; needs the kernel's
    netem); ``cpus`` is each host's CPU budget (default: this machine's cores / hosts), given as a quota of
    ``cpus * period_us`` per CFS period of ``period_us``; ``burst_us`` lets a host carry up to that much
    unused quota into a later period (``cpu.cfs_burst_us``); ``pin`` puts host i on core i mod cores (a
    cpuset), so hosts do not migrate between cores. ``nic_cpus`` > 0 gives each host a NIC: gloo's
    communication threads move into a group of their own with that budget (:mod:`.cgroups`), taken from the
    hosts' default budget ((cores - hosts * nic_cpus) / hosts), so traffic no longer competes with compute.
    ``memory`` > 0 holds each host's processes to that many bytes (a cgroup memory limit, no swap): a host over it
    loses a process to the kernel's OOM killer, and the failure says it ran out of memory. Its processes' C heap
    then hands every block of 128 KiB or more back to the system when it is freed (glibc's mmap and trim
    thresholds fixed there), as a device's memory is free again when a tensor is: glibc's own rule would keep
    freed blocks (FSDP's gathered units, a bucket) cached and count them against the limit as if alive.
    ``HostResult.peak_memory`` is the most a host's processes held at once in one run.

    >>> with EmulatedCluster(2, "200mbit", prefix="doc") as c:
    ...     [r.stdout for r in c.run([["hostname", "-I"]] * 2)]
    ['10.77.0.1 \\n', '10.77.0.2 \\n']
    """

    def __init__(self, hosts: int, rate: str | None = "1gbit", delay: str = "0ms", cpus: float | None = None,
                 prefix: str = "tsl", period_us: int = PERIOD_US, burst_us: int = 0, pin: bool = False,
                 nic_cpus: float = 0.0, memory: int = 0):
        if not isinstance(hosts, int) or not 1 <= hosts <= 254:
            raise ClusterError(f"hosts must be an integer from 1 to 254 (one address each in {SUBNET}.0/24), "
                               f"not {hosts!r}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            # Interface names are limited to 15 characters: "{prefix}-s{i}" must fit.
            raise ClusterError(f"prefix {prefix!r} must be 1-8 lowercase letters or digits, starting with a letter")
        self.hosts, self.rate, self.delay, self.prefix = hosts, rate and str(rate), str(delay), prefix
        self.rate_bits, self.delay_s = rate and parse_rate(rate), parse_delay(delay)
        if not isinstance(period_us, int) or not 1000 <= period_us <= 1_000_000:  # the kernel's limits
            raise ClusterError(f"period_us must be an integer from 1000 to 1000000 (1 ms to 1 s), not {period_us!r}")
        cores = os.cpu_count() or 1
        if not (isinstance(nic_cpus, (int, float)) and math.isfinite(nic_cpus) and nic_cpus >= 0
                and (nic_cpus == 0 or nic_cpus * period_us >= 1000) and hosts * nic_cpus < cores):
            raise ClusterError(f"nic_cpus must be 0 (no NIC group) or a finite budget of at least {1000 / period_us:g} "
                               f"core per host (1 ms per {period_us} us period) whose total over {hosts} hosts stays "
                               f"under the machine's {cores} cores, not {nic_cpus!r}")
        self.nic_cpus = float(nic_cpus)
        self.cpus = float(cpus) if cpus is not None else (cores - hosts * self.nic_cpus) / hosts
        if not self.cpus * period_us >= 1000 or not math.isfinite(self.cpus):  # the smallest quota is 1 ms a period
            raise ClusterError(f"cpus must be a finite number of at least {1000 / period_us:g} per host (a quota of "
                               f"1 ms per {period_us} us period), not {cpus!r}")
        quota = int(self.cpus * period_us)
        if not isinstance(burst_us, int) or not 0 <= burst_us <= quota:
            raise ClusterError(f"burst_us must be an integer from 0 to the quota ({quota} us), not {burst_us!r}")
        self.period_us, self.burst_us, self.pin = period_us, burst_us, bool(pin)
        if not (isinstance(memory, int) and (memory == 0 or memory >= 64 * 2**20)):
            raise ClusterError(f"memory must be 0 (no limit) or a host's limit in bytes of at least 64 MiB, not "
                               f"{memory!r}")
        self.memory = memory
        self.is_up = False
        self._old_handlers: dict = {}

    @property
    def host_names(self) -> list[str]:
        """The hosts' namespace names, ``{prefix}-h0`` ... (usable with ``ip netns exec``)."""
        return [f"{self.prefix}-h{i}" for i in range(self.hosts)]

    @property
    def addresses(self) -> list[str]:
        """Each host's address on its ``eth0``, 10.77.0.1 for host 0 and so on."""
        return [f"{SUBNET}.{i + 1}" for i in range(self.hosts)]

    def cgroup(self, host: int) -> Path:
        """The cgroup v1 cpu group that holds host ``host``'s processes."""
        return cgroups.cpu_group(self.prefix, host)

    def cpuset(self, host: int) -> Path | None:
        """The cgroup v1 cpuset group that pins host ``host`` to its core (None unless ``pin``)."""
        return cgroups.cpuset_group(self.prefix, host) if self.pin else None

    @classmethod
    def attach(cls, prefix: str = "tsl") -> EmulatedCluster:
        """The cluster that ``up()`` (e.g. ``tessel cluster up``) left running under ``prefix``."""
        try:
            s = json.loads(state_file(prefix).read_text())
            c = cls(s["hosts"], s["rate"], s["delay"], s["cpus"], prefix, s.get("period_us", PERIOD_US),
                    s.get("burst_us", 0), s.get("pin", False), s.get("nic_cpus", 0.0), s.get("memory", 0))
        except (OSError, ValueError, KeyError):
            c = None
        if c is None or set(namespaces(prefix)) != {f"{prefix}-sw", *c.host_names}:
            raise ClusterError(f"no emulated cluster '{prefix}' is up; start one with 'tessel cluster up --hosts N' "
                               "or give 'tessel cluster run' --hosts N to run on a temporary one")
        c.is_up = True
        return c

    def up(self) -> EmulatedCluster:
        """Build the hosts, links and CPU groups (removing leftovers of this prefix first); returns self. A cluster
        of the prefix that a live process still holds is not a leftover: ClusterError names that process."""
        holder = held_by(self.prefix)
        if holder is not None:
            raise ClusterError(f"emulated cluster '{self.prefix}' is in use by pid {holder} ({command_of(holder)}); "
                               f"wait for it to end, or stop it and run 'tessel cluster down --prefix {self.prefix}'")
        check_machine()
        remove_cluster(self.prefix)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._save_state()
        self.is_up = True
        return self

    def _save_state(self) -> None:
        state_file(self.prefix).write_text(json.dumps(
            {"hosts": self.hosts, "rate": self.rate, "delay": self.delay, "cpus": self.cpus,
             "period_us": self.period_us, "burst_us": self.burst_us, "pin": self.pin, "nic_cpus": self.nic_cpus,
             "memory": self.memory, "owner": os.getpid()}))

    def set_rate(self, rate: str | None) -> None:
        """Reshape every link to ``rate`` (None: unshaped) in place, keeping hosts and processes.

        A benchmark round alternates link rates on one set of hosts, so runs at different rates (and the
        compute-only runs) stand close in time."""
        bits = rate and parse_rate(rate)
        if bits is None and self.delay_s > 0:
            raise ClusterError("a delay needs a rate; give both or neither")
        self.rate, self.rate_bits = rate and str(rate), bits
        sw = f"{self.prefix}-sw"
        for i, ns in enumerate(self.host_names):
            for where, dev in ((ns, HOST_INTERFACE), (sw, f"{self.prefix}-s{i}")):
                sh("tc", "-n", where, "qdisc", "del", "dev", dev, "root", check=False)  # none when unshaped
                self._shape(where, dev)
        self._save_state()

    def _build(self) -> None:
        sw = f"{self.prefix}-sw"
        for args in (["netns", "add", sw], ["-n", sw, "link", "add", "br0", "type", "bridge"],
                     ["-n", sw, "link", "set", "br0", "up"]):
            sh("ip", *args)
        for i, (ns, addr) in enumerate(zip(self.host_names, self.addresses)):
            port = f"{self.prefix}-s{i}"
            for args in (["netns", "add", ns],
                         ["link", "add", HOST_INTERFACE, "netns", ns, "type", "veth", "peer", "name", port,
                          "netns", sw],
                         ["-n", ns, "addr", "add", f"{addr}/24", "dev", HOST_INTERFACE],
                         ["-n", ns, "link", "set", HOST_INTERFACE, "up"],
                         ["-n", ns, "link", "set", "lo", "up"],  # torchrun's agent and local stores use it
                         ["-n", sw, "link", "set", port, "master", "br0", "up"]):
                sh("ip", *args)
            self._shape(ns, HOST_INTERFACE)  # host -> switch
            self._shape(sw, port)  # switch -> host
            try:
                cgroups.make(self.prefix, i, self.cpus, self.period_us, self.burst_us, self.pin)
                if self.nic_cpus:
                    cgroups.make_nic(self.prefix, i, self.nic_cpus, self.period_us)
                if self.memory:
                    cgroups.make_memory(self.prefix, i, self.memory)
            except CgroupError as e:
                raise ClusterError(str(e)) from None

    def _shape(self, ns: str, dev: str) -> None:
        if self.rate_bits is None:
            if self.delay_s > 0:
                raise ClusterError("a delay needs a rate; give both or neither")
            return
        # tbf needs a bucket of at least rate/HZ bytes to reach its rate (HZ is 250 on common kernels); the
        # queue holds 50 ms at the line rate, enough for TCP to keep the link busy without bufferbloat.
        burst = max(int(self.rate_bits / 8 / 250), 32 * 1024)
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
            f"{int(self.rate_bits)}bit", "burst", str(burst), "latency", QUEUE)
        if self.delay_s > 0:
            r = sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem", "delay",
                    f"{self.delay_s / 2 * 1e6:.0f}us", check=False)
            if r.returncode != 0:
                raise ClusterError(f"delay {self.delay!r} needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), "
                                   f"which failed here ({r.stderr.strip()}); use delay 0ms on this machine")

    def down(self) -> None:
        """Kill every process on the hosts and remove namespaces, links, qdiscs, cgroups and state."""
        remove_cluster(self.prefix)
        self.is_up = False

    def status(self) -> dict:
        """Settings, hosts and leftovers, as printed by ``tessel cluster status``.

        >>> EmulatedCluster(2, "1gbit", cpus=1, prefix="doc").status()["hosts"][1]["address"]
        '10.77.0.2'
        """
        return {"prefix": self.prefix, "up": self.is_up, "rate": self.rate, "delay": self.delay, "cpus": self.cpus,
                "nic_cpus": self.nic_cpus,
                "hosts": [{"name": n, "address": a, "cgroup": str(self.cgroup(i))}
                          for i, (n, a) in enumerate(zip(self.host_names, self.addresses))],
                "leftovers": leftovers(self.prefix)}

    def torchrun_commands(self, module_args: list[str], port: int = 29400, run_id: str | None = None,
                          max_restarts: int = 0, min_hosts: int | None = None) -> list:
        """One torchrun node per host (one worker each), with rendezvous on host 0; pass them to ``run``.

        Across namespaces, torch cannot guess which node holds the store or which address is its own,
        so host 0 gets ``is_host=1``, the others ``is_host=0``, and every node its ``--local-addr``.
        ``max_restarts``: torchrun's restarts after a failure; ``min_hosts``: the job may re-form on as few
        hosts as this after one is lost (``--nnodes MIN:MAX``).

        >>> EmulatedCluster(2, prefix="doc").torchrun_commands(["-m", "tessel", "train"])[1][-9:]
        ['--local-addr', '10.77.0.2', '--rdzv-conf', 'is_host=0', '--max-restarts', '0', '-m', 'tessel', 'train']
        """
        run_id = run_id or f"tessel-{uuid.uuid4().hex[:8]}"
        nodes = f"{min_hosts}:{self.hosts}" if min_hosts else str(self.hosts)
        # With fewer than all hosts back, the rendezvous waits this long for the rest (torch's default 30 s):
        # every emulated host starts within a second, and a lost one is not coming back. A lost host's agent
        # stays in the rendezvous until it has missed its keep-alives (torch: 3 of one per 5 s); its peers on the
        # same machine are not starved that long, so 3 of one per 2 s says it is gone sooner.
        last_call = (f",last_call_timeout={LAST_CALL_S},keep_alive_interval={KEEP_ALIVE_S},keep_alive_max_attempt=3"
                     if min_hosts else "")
        return [[sys.executable, "-m", "torch.distributed.run", "--nnodes", nodes, "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.addresses[0]}:{port}", "--rdzv-id", run_id,
                 "--local-addr", addr, "--rdzv-conf", f"is_host={int(i == 0)}{last_call}",
                 "--max-restarts", str(max_restarts), *module_args]
                for i, addr in enumerate(self.addresses)]

    def run(self, commands: list[list[str]], env: dict | None = None, timeout: float | None = None,
            cwd: str | None = None, capture: bool = True, check: bool = True,
            keep_going: bool = False) -> list[HostResult]:
        """Run ``commands[i]`` on host i, all at once, and wait for all; one result per host.

        Each runs in its host's namespace and cgroup with OMP_NUM_THREADS=1, GLOO_SOCKET_IFNAME=eth0,
        TESSEL_HOST_CPUS (the host's CPU budget), TESSEL_HOST_CFS_QUOTA_US (its quota per CFS period, with the burst it
        may carry over) and, on shaped links, TESSEL_LINK_MBIT.
        When one fails (or ``timeout`` passes) the others are stopped; with ``check`` that raises HostFailed
        naming the host. ``keep_going``: a failed host does not stop the others (an elastic job that re-forms
        without it); ``check`` then raises only if the last host to end failed. ``capture=False`` lets output
        through instead of returning it.

        >>> with EmulatedCluster(2, prefix="doc") as c:
        ...     [r.returncode for r in c.run([["true"], ["sh", "-c", "exit 3"]], check=False)]
        [0, 3]
        """
        if not self.is_up:
            raise ClusterError(f"cluster '{self.prefix}' is not up; call up() or use it as a context manager")
        if len(commands) != self.hosts:
            raise ClusterError(f"got {len(commands)} commands for {self.hosts} hosts; give one per host")
        # one rendezvous store per restart round: torch's shared one keeps the dead round's addresses (#135712)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": HOST_INTERFACE,
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})}
        if self.rate_bits:  # what tessel's cost model (--sparse auto) takes as the link rate
            env.setdefault("TESSEL_LINK_MBIT", f"{self.rate_bits / 1e6:g}")
        env.setdefault("TESSEL_HOST_CPUS", f"{self.cpus:g}")  # the planner's compute speed per host (--plan auto)
        # the host's CFS quota as the probe reads it from its cgroup, which `ip netns exec`'s own /sys hides: what
        # a host that has idled runs at a whole core (its quota and the unused quota it may carry over)
        env.setdefault("TESSEL_HOST_CFS_QUOTA_US", str(int(self.cpus * self.period_us) + self.burst_us))
        if self.memory:  # freed tensors leave the host's count, as on a device (see the class's note)
            env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MALLOC_RETURN))
            env.setdefault("MALLOC_TRIM_THRESHOLD_", str(MALLOC_RETURN))
        # The shell joins the host's cgroups before exec'ing into the namespace, so every descendant is counted.
        script = 'for f in $0; do echo $$ > "$f" || exit 126; done; exec ip netns exec "$@"'
        procs, files, ends, failed, start = [], [], [None] * self.hosts, None, time.monotonic()
        kills = [cgroups.oom_kills(self.prefix, i) for i in range(self.hosts)]  # the counts only ever grow
        for i in range(self.hosts if self.memory else 0):  # each run's own peak, not the cluster's
            cgroups.peak_memory(self.prefix, i, reset=True)
        mover = cgroups.ThreadMover(self.prefix, self.hosts) if self.nic_cpus else None
        try:
            for i, cmd in enumerate(commands):
                out = [tempfile.TemporaryFile() for _ in range(2)] if capture else [None, None]
                files.append(out)
                memory = cgroups.memory_group(self.prefix, i) if self.memory else None
                groups = " ".join(str(g / "cgroup.procs") for g in (self.cgroup(i), self.cpuset(i), memory) if g)
                procs.append(subprocess.Popen(
                    ["sh", "-c", script, groups, self.host_names[i], *cmd],
                    env=env, cwd=cwd, stdout=out[0], stderr=out[1], start_new_session=True))
            while any(e is None for e in ends) and failed is None:
                # Ctrl-C inside Popen.poll can leave its internal lock held, and the p.wait() of the clean-up
                # then blocks forever; signals wait until the polls are done.
                with signals_held():
                    for i, p in enumerate(procs):
                        if ends[i] is None and p.poll() is not None:
                            ends[i] = time.monotonic() - start
                            if p.returncode != 0 and failed is None and not (keep_going and any(
                                    e is None for e in ends)):
                                failed = i
                if timeout is not None and time.monotonic() - start > timeout and failed is None:
                    failed = next(i for i, e in enumerate(ends) if e is None)
                if mover is not None:  # gloo starts its threads when a job makes its process groups
                    mover.poll()
                time.sleep(0.01 if mover is None else 0.05)
        finally:
            self._stop(procs)
        results = []
        for i, (p, out) in enumerate(zip(procs, files)):
            text = [_read_back(f) for f in out]
            results.append(HostResult(i, commands[i], p.returncode, text[0], text[1],
                                      ends[i] if ends[i] is not None else time.monotonic() - start,
                                      cgroups.oom_kills(self.prefix, i) > kills[i],
                                      cgroups.peak_memory(self.prefix, i)))
        if check and failed is not None:
            code = procs[failed].returncode
            oom = next((r.host for r in results if r.out_of_memory), None)
            if oom is not None:  # the host that ran out is the cause, whichever host ended first
                failed = oom
            how = (f"ran out of its memory limit ({self.memory / 2**20:,.0f} MiB): the kernel killed a process, so "
                   "the plan does not fit" if results[failed].out_of_memory else
                   f"did not finish within {timeout:g} s" if ends[failed] is None else
                   f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
            last = (results[failed].stderr or "").strip().splitlines()[-1:]  # e.g. the exception of a traceback
            raise HostFailed(f"host {failed} ({self.host_names[failed]}, {self.addresses[failed]}) {how}; the other "
                             f"hosts were stopped{': ' + last[0] if last else ''}", failed, code, results)
        return results

    def _stop(self, procs: list[subprocess.Popen]) -> None:
        """Stop whatever still runs on the hosts (SIGTERM, then SIGKILL after 3 s) and reap our children."""
        with signals_held():
            running = [p for p in procs if p.poll() is None]
            for p in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
            if running:
                # A process may have left our process group (torchrun puts workers in their own); the cgroup has all.
                kill_all(host_pids(self.prefix), signal.SIGTERM)
            deadline = time.monotonic() + 3
            while any(p.poll() is None for p in running) and time.monotonic() < deadline:
                time.sleep(0.02)
            if running:
                kill_all(host_pids(self.prefix), signal.SIGKILL)
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def __enter__(self) -> EmulatedCluster:
        # SIGTERM and SIGHUP become KeyboardInterrupt, so they unwind through __exit__ like Ctrl-C does.
        if threading.current_thread() is threading.main_thread():
            self._old_handlers = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            return self.up()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore()

    def _restore(self) -> None:
        for s, handler in self._old_handlers.items():
            signal.signal(s, handler)
        self._old_handlers = {}
