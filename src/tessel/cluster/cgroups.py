"""An emulated host's CPU budget: a cgroup v1 cpu group (CFS quota per period, optional burst) and, when
pinned, a cpuset group holding it on one core. Made by ``EmulatedCluster``, found and removed by prefix.

    >>> host_groups("nosuchprefix")
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
PERIOD_US = 10_000


class CgroupError(TesselError):
    """A host's CPU group cannot be made here (the message says what the kernel lacks)."""


def cpu_group(prefix: str, host: int) -> Path:
    return CGROUP_ROOT / "tessel" / f"{prefix}-h{host}"


def cpuset_group(prefix: str, host: int) -> Path:
    return CPUSET_ROOT / "tessel" / f"{prefix}-h{host}"


def host_groups(prefix: str) -> list[Path]:
    """The hosts' cpu groups and, where pinned, their cpuset groups."""
    pattern = re.compile(rf"{re.escape(prefix)}-h\d+")
    parents = [root / "tessel" for root in (CGROUP_ROOT, CPUSET_ROOT) if (root / "tessel").is_dir()]
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


def remove(prefix: str) -> None:
    """Remove the hosts' groups (their processes must be gone), and the parents once no prefix uses them."""
    for group in host_groups(prefix):
        for _ in range(100):  # the kernel may take a moment to account for the last exits
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.02)
    for root in (CGROUP_ROOT, CPUSET_ROOT):
        with contextlib.suppress(OSError):
            (root / "tessel").rmdir()  # only succeeds once no other prefix uses it
