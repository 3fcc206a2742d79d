"""``tessel cluster``: bring an emulated cluster up, run on it, show it, take it down.

    tessel cluster up --hosts 4 --rate 1gbit [--delay 0ms] [--cpus 0.5]
    tessel cluster run -- hostname -I                               # each host prints its address
    tessel cluster run --torchrun -- -m tessel train --steps 5    # one torchrun node per host
    tessel cluster status
    tessel cluster down
    tessel cluster run --hosts 2 --rate 200mbit --torchrun -- -m tessel train --steps 5   # up, run, down

``run`` prints each host's exit status on stderr and exits 1 if any host failed. With ``--hosts`` it
builds a temporary cluster for this one command and removes it afterwards (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import math
import sys

from .emulate import EmulatedCluster, parse_size
from .housekeeping import ClusterError, leftovers, remove_cluster


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``tessel cluster {up,run,down,status}`` on the main parser's subparsers.

    >>> import argparse
    >>> sub = argparse.ArgumentParser(prog="tessel").add_subparsers(dest="verb")
    >>> add_parser(sub).parse_args(["up", "--hosts", "2"]).hosts
    2
    """
    p = subparsers.add_parser("cluster", help="emulate N hosts on this machine (network namespaces, tc, cgroups)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="cluster_verb", required=True)

    def shape_flags(q, required: bool):
        q.add_argument("--hosts", type=int, required=required,
                       help="number of hosts" + ("" if required else "; builds a temporary cluster for this command"))
        q.add_argument("--rate", help="rate of every host's link, e.g. 200mbit, 1gbit (default 1gbit)")
        q.add_argument("--delay", help="one-way host-to-host delay, e.g. 5ms (default 0ms; needs netem)")
        q.add_argument("--cpus", type=float, help="CPU budget of each host (default: cores / hosts)")
        q.add_argument("--memory", help="memory limit of each host, e.g. 2GiB (default none): a host over it loses "
                                        "a process to the kernel's OOM killer, as a device out of memory fails")

    for name, helptext in [("up", "build the hosts and keep them until 'down'"), ("run", "run a command on every host"),
                           ("status", "show the cluster and anything left behind"),
                           ("down", "stop everything on the hosts and remove them")]:
        q = verbs.add_parser(name, help=helptext)
        q.add_argument("--prefix", default="tsl", help="name prefix of namespaces and cgroups (default tsl)")
        if name == "up":
            shape_flags(q, required=True)
        if name == "run":
            shape_flags(q, required=False)
            q.add_argument("--torchrun", action="store_true",
                           help="run CMD as the arguments of one torchrun node per host (e.g. -m tessel train ...)")
            q.add_argument("--timeout", type=float, help="stop every host after this many seconds")
            q.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    return p


def _memory(text: str | None) -> int:
    """``--memory`` in bytes (0: no limit); one line naming what is wrong otherwise."""
    if text is None:
        return 0
    value = parse_size(text)
    if not (math.isfinite(value) and value >= 64 * 2**20):
        raise ClusterError(f"--memory '{text}' is not a size of at least 64MiB; give e.g. 2GiB or 768MiB")
    return int(value)


def _describe(c: EmulatedCluster) -> str:
    memory = f", memory {c.memory / 2**20:,.0f} MiB each" if c.memory else ""
    return (f"cluster {c.prefix}: {c.hosts} hosts {c.addresses[0]}..{c.addresses[-1]}, rate {c.rate}, "
            f"delay {c.delay}, {c.cpus:g} CPU each{memory}")


def _run(ns: argparse.Namespace) -> int:
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        raise ClusterError("no command given; write it after '--', e.g. tessel cluster run -- hostname -I")
    shaping = {"rate": ns.rate, "delay": ns.delay, "cpus": ns.cpus, "memory": ns.memory}
    if ns.hosts is None:
        if any(v is not None for v in shaping.values()):
            raise ClusterError("--rate, --delay, --cpus and --memory go with --hosts (a temporary cluster) or with "
                               "'tessel cluster up'")
        return _run_on(EmulatedCluster.attach(ns.prefix), command, ns)
    if any(line.startswith("file ") for line in leftovers(ns.prefix)):
        # up() would replace it; someone may be using it.
        raise ClusterError(f"cluster '{ns.prefix}' is up; drop --hosts to run on it, or 'tessel cluster down' first")
    with EmulatedCluster(ns.hosts, ns.rate or "1gbit", ns.delay or "0ms", ns.cpus, ns.prefix,
                         memory=_memory(ns.memory)) as c:
        print(_describe(c) + " (temporary)", file=sys.stderr)
        return _run_on(c, command, ns)


def _run_on(c: EmulatedCluster, command: list[str], ns: argparse.Namespace) -> int:
    commands = c.torchrun_commands(command) if ns.torchrun else [command] * c.hosts
    results = c.run(commands, timeout=ns.timeout, capture=False, check=False)
    for r in results:
        code = r.returncode
        how = f"exited with code {code}" if code >= 0 else f"was stopped by signal {-code}"
        if r.out_of_memory:
            how += f", out of its memory limit ({c.memory / 2**20:,.0f} MiB): the plan does not fit"
        print(f"tessel: host {r.host} ({c.addresses[r.host]}) {how} after {r.seconds:.1f} s", file=sys.stderr)
    return 0 if all(r.returncode == 0 for r in results) else 1


def main(ns: argparse.Namespace) -> int:
    """Carry out a parsed ``tessel cluster`` command; the exit code. Errors raise ClusterError.

    >>> main(argparse.Namespace(cluster_verb="status", prefix="nosuchprefix"))
    no emulated cluster 'nosuchprefix' is up
    leftovers: none
    0
    """
    if ns.cluster_verb == "up":
        c = EmulatedCluster(ns.hosts, ns.rate or "1gbit", ns.delay or "0ms", ns.cpus, ns.prefix,
                            memory=_memory(ns.memory)).up()
        print(_describe(c))
        return 0
    if ns.cluster_verb == "run":
        return _run(ns)
    if ns.cluster_verb == "down":
        removed = remove_cluster(ns.prefix)
        print(f"cluster {ns.prefix} removed" if removed else f"nothing of cluster {ns.prefix} to remove")
        return 0
    try:
        c = EmulatedCluster.attach(ns.prefix)
        print(_describe(c))
        for i, (name, addr) in enumerate(zip(c.host_names, c.addresses)):
            print(f"  host {i}  {addr}  netns {name}  cgroup {c.cgroup(i)}")
    except ClusterError:
        print(f"no emulated cluster '{ns.prefix}' is up")
        found = leftovers(ns.prefix)
        print("leftovers: " + (", ".join(found) if found else "none"))
    return 0
