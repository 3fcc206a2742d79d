"""What an emulated cluster leaves on this machine, found and removed by its prefix, and whether this machine
can host one: the hosts' network namespaces (``{prefix}-sw``, ``{prefix}-h{i}``), the processes in them, their
CPU groups (:mod:`.cgroups`) and the state file that ``tessel cluster up`` writes for later commands.

``EmulatedCluster`` removes all of it on exit; a crashed run's leftovers are removed by the next ``up()`` of
the same prefix, or by ``tessel cluster down``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..errors import TesselError
from . import cgroups
from .cgroups import CGROUP_ROOT

NETNS_DIR = Path("/run/netns")
STATE_DIR = Path("/run")


class ClusterError(TesselError):
    """The emulated cluster cannot be built or used here (the message says what is missing)."""


def state_file(prefix: str) -> Path:  # where up() records the settings for later 'tessel cluster' commands
    return STATE_DIR / f"tessel-cluster-{prefix}.json"


def namespaces(prefix: str) -> list[str]:
    """The cluster's namespaces present now: its switch and hosts, sorted by name."""
    pattern = re.compile(rf"{re.escape(prefix)}-(sw|h\d+)")
    names = [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []
    return sorted(n for n in names if pattern.fullmatch(n))


def leftovers(prefix: str = "tsl") -> list[str]:
    """Every namespace, cgroup and state file of the cluster ``prefix`` still present; [] when clean.

    >>> leftovers("nosuchprefix")
    []
    """
    found = [f"netns {n}" for n in namespaces(prefix)] + [f"cgroup {p}" for p in cgroups.host_cgroups(prefix)]
    return found + ([f"file {state_file(prefix)}"] if state_file(prefix).exists() else [])


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ``ip`` or ``tc`` command; with ``check``, a failure raises ClusterError with its message."""
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ClusterError(f"'{' '.join(args)}' failed: {' '.join((r.stderr or r.stdout).split())}")
    return r


def live(pid: int) -> bool:
    """True for a process that still runs; a zombie holds no namespace, cgroup or port any more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def held_by(prefix: str) -> int | None:
    """The live process, other than this one, that built the cluster ``prefix`` and holds it (a benchmark, a
    ``with EmulatedCluster(...)``); None when none does (``tessel cluster up`` exits and leaves it to later
    commands, a crashed run leaves it to the next ``up``).

    >>> held_by("nosuchprefix") is None
    True
    """
    try:
        owner = int(json.loads(state_file(prefix).read_text())["owner"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return owner if owner != os.getpid() and live(owner) else None


def command_of(pid: int) -> str:
    """The command line of ``pid``, shortened, for a message."""
    try:
        return " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")).strip()[:120]
    except OSError:
        return "?"


def host_pids(prefix: str) -> set[int]:
    """Every live process in the cluster's CPU groups or namespaces, this one excepted."""
    pids: set[int] = set()
    for group in cgroups.host_cgroups(prefix):
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (group / "cgroup.procs").read_text().split()}
    if shutil.which("ip"):
        for ns in namespaces(prefix):  # also catches processes started by hand with 'ip netns exec'
            pids |= {int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()}
    return {p for p in pids if p != os.getpid() and live(p)}


def kill_all(pids: set[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``, skipping those already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def signals_held():
    """Defer Ctrl-C and SIGTERM while cleaning up; they are delivered (and raise) once it is done."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def remove_cluster(prefix: str = "tsl") -> list[str]:
    """Kill every process on the cluster's hosts, then remove its namespaces, cgroups and state file.

    Processes go first: a namespace whose last process is alive outlives ``ip netns del`` unseen, and a
    cgroup with processes cannot be removed. Returns what was removed (as ``leftovers`` names it).

    >>> remove_cluster("nosuchprefix")
    []
    """
    found = leftovers(prefix)
    with signals_held():
        pids = host_pids(prefix)
        kill_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            time.sleep(0.02)
            pids = {p for p in pids if live(p)} | host_pids(prefix)
        # Deleting a host namespace destroys its veth pair, and with it both ends' qdiscs.
        for ns in sorted(namespaces(prefix), key=lambda n: n.endswith("-sw")):
            sh("ip", "netns", "del", ns, check=False)
        cgroups.remove(prefix)
        state_file(prefix).unlink(missing_ok=True)
    left = leftovers(prefix)
    if left:
        raise ClusterError(f"could not remove {', '.join(left)}")
    return found


def check_machine() -> None:
    """Raise ClusterError unless this machine can host an emulated cluster (root, ip, tc, cgroup v1 cpu).

    >>> check_machine() if os.geteuid() == 0 else None
    """
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (network namespaces, tc, cgroups); run as root")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise ClusterError(f"the emulated cluster needs '{tool}' (package iproute2), which is not on PATH")
    try:
        (CGROUP_ROOT / "tessel").mkdir(exist_ok=True)
        (CGROUP_ROOT / "tessel" / "cpu.cfs_quota_us").stat()
    except OSError:
        raise ClusterError(f"cannot create a cpu cgroup under {CGROUP_ROOT}: the emulated cluster needs the "
                           "cgroup v1 cpu controller mounted there and writable, to give each host its own CPU budget"
                           ) from None
