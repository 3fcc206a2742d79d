"""An emulated host's CPU budget: a cgroup v1 cpu group (CFS quota per period, optional burst) and, when
pinned, a cpuset group holding it on one core; optionally a second cpu group, the host's *NIC*, with a
budget of its own for gloo's communication threads, and a memory group holding the host to a memory limit.
Made by ``EmulatedCluster``, found and removed by prefix.

A real network card moves bytes without the host's cores; gloo on an emulated host moves them on the host's
CPU quota, so traffic overlapped with compute slows the compute it should hide behind. cgroup v1 accepts a
single thread id in a group's ``tasks``, so :func:`move_gloo_threads` puts each host's gloo threads (named
``gloo_tcp_loop`` and ``pt_gloo_runloop``) into its NIC group as they appear.

    >>> host_cgroups("nosuchprefix")
    []
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from ..errors import TesselError

CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
PERIOD_US = 10_000


class CgroupError(TesselError):
    """A host's CPU group cannot be made here (the message says what the kernel lacks)."""


def cpu_group(prefix: str, host: int) -> Path:
    return CGROUP_ROOT / "tessel" / f"{prefix}-h{host}"


def cpuset_group(prefix: str, host: int) -> Path:
    return CPUSET_ROOT / "tessel" / f"{prefix}-h{host}"


def memory_group(prefix: str, host: int) -> Path:
    return MEMORY_ROOT / "tessel" / f"{prefix}-h{host}"


def make_memory(prefix: str, host: int, limit: int) -> None:
    """Host ``host``'s memory group: its processes together may hold ``limit`` bytes (and as much swap: none),
    over which the kernel's OOM killer ends one of them, as a device out of memory would end the job."""
    group = memory_group(prefix, host)
    try:
        group.mkdir(parents=True)
        (group / "memory.limit_in_bytes").write_text(str(limit))
        swap = group / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(limit))
    except OSError as e:
        raise CgroupError(f"a memory limit needs the cgroup v1 memory controller at {MEMORY_ROOT}, which failed "
                          f"here ({e.strerror}); run without a memory limit") from None


def oom_kills(prefix: str, host: int) -> int:
    """Processes of host ``host`` the kernel has killed for its memory limit so far (0 without a memory group)."""
    try:
        text = (memory_group(prefix, host) / "memory.oom_control").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)


def peak_memory(prefix: str, host: int, reset: bool = False) -> int:
    """The most bytes host ``host``'s processes have held at once since the last reset (0 without a memory group);
    ``reset`` starts the count again from what they hold now."""
    path = memory_group(prefix, host) / "memory.max_usage_in_bytes"
    try:
        if reset:
            path.write_text("0")
        return int(path.read_text())
    except OSError:
        return 0


def nic_group(prefix: str, host: int) -> Path:
    return CGROUP_ROOT / "tessel" / f"{prefix}-h{host}-nic"


GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")  # gloo's transport loop and ProcessGroupGloo's workers


def host_cgroups(prefix: str) -> list[Path]:
    """The hosts' cpu groups, their NIC groups and, where pinned, their cpuset groups."""
    pattern = re.compile(rf"{re.escape(prefix)}-h\d+(-nic)?")
    parents = [root / "tessel" for root in (CGROUP_ROOT, CPUSET_ROOT, MEMORY_ROOT) if (root / "tessel").is_dir()]
    return sorted(p for parent in parents for p in parent.iterdir() if p.is_dir() and pattern.fullmatch(p.name))


def make(prefix: str, host: int, cpus: float, period_us: int, burst_us: int, pin: bool) -> None:
    """Host ``host``'s cpu group (quota ``cpus * period_us`` per ``period_us``, burst ``burst_us``) and, with
    ``pin``, its cpuset group on core ``host`` mod cores."""
    group = cpu_group(prefix, host)
    group.mkdir(parents=True)
    (group / "cpu.cfs_period_us").write_text(str(period_us))
    (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period_us)))
    if burst_us:
        try:
            (group / "cpu.cfs_burst_us").write_text(str(burst_us))
        except OSError as e:
            raise CgroupError(f"burst_us needs the kernel's cpu.cfs_burst_us (Linux 5.14+), which failed here "
                              f"({e.strerror}); use burst_us 0 on this machine") from None
    if pin:
        pinned = cpuset_group(prefix, host)
        try:
            pinned.mkdir(parents=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # a new parent starts empty: it gets the root's
                (pinned.parent / name).write_text((CPUSET_ROOT / name).read_text())
            (pinned / "cpuset.mems").write_text((CPUSET_ROOT / "cpuset.mems").read_text())
            (pinned / "cpuset.cpus").write_text(str(host % (os.cpu_count() or 1)))
        except OSError as e:
            raise CgroupError(f"pin needs the cgroup v1 cpuset controller at {CPUSET_ROOT}, which failed here "
                              f"({e.strerror}); run without pin") from None


def make_nic(prefix: str, host: int, cpus: float, period_us: int) -> None:
    """Host ``host``'s NIC group: a cpu group beside the host's with a quota of ``cpus * period_us``."""
    group = nic_group(prefix, host)
    group.mkdir(parents=True)
    (group / "cpu.cfs_period_us").write_text(str(period_us))
    (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period_us)))


class ThreadMover:
    """Moves gloo's threads from each host's cpu group to its NIC group; call ``poll()`` while jobs run.

    A thread is named just after it starts, so an unnamed-looking thread is looked at a few more times before
    it is taken for a compute thread and skipped from then on."""

    LOOKS = 5

    def __init__(self, prefix: str, hosts: int) -> None:
        self.prefix, self.hosts = prefix, hosts
        self.looked: dict[int, int] = {}  # thread id -> times seen with another name
        self.moved = 0

    def poll(self) -> int:
        """Move the gloo threads now in the hosts' groups; returns how many moved."""
        n = 0
        for host in range(self.hosts):
            try:
                tids = (cpu_group(self.prefix, host) / "tasks").read_text().split()
            except OSError:
                continue
            for tid in map(int, tids):
                if self.looked.get(tid, 0) >= self.LOOKS:
                    continue
                try:
                    name = Path(f"/proc/{tid}/comm").read_text().strip()
                    if name in GLOO_THREADS:
                        (nic_group(self.prefix, host) / "tasks").write_text(str(tid))
                        n += 1
                        continue
                except OSError:  # it ended meanwhile
                    continue
                self.looked[tid] = self.looked.get(tid, 0) + 1
        self.moved += n
        return n


def remove(prefix: str) -> None:
    """Remove the hosts' groups (their processes must be gone), and the parents once no prefix uses them."""
    for group in host_cgroups(prefix):
        for _ in range(100):  # the kernel may take a moment to account for the last exits
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.02)
    for root in (CGROUP_ROOT, CPUSET_ROOT, MEMORY_ROOT):
        with contextlib.suppress(OSError):
            (root / "tessel").rmdir()  # only succeeds once no other prefix uses it
