"""Bytes a network interface sent, as the kernel counts them (headers included, every process on the interface
together), read from ``/proc/self/net/dev``: the reading process's own network namespace, whatever namespace
``/sys`` was mounted in.

tessel.comm counts what tessel's own collectives send; torch's DDP with sparse gradients sends through its
reducer, which tessel does not see. On an emulated host (a network namespace with one interface, ``eth0``, and
one rank) the interface's count is that rank's traffic, so a run can record it beside the counted bytes: the
measure for torch's traffic and a check on tessel's count (the wire carries the count plus TCP/IP headers and
the acknowledgements of what the host received).
"""

from __future__ import annotations

from pathlib import Path

DEV = Path("/proc/self/net/dev")


def _table() -> dict[str, list[int]]:
    """Interface -> its counters: received bytes, packets, errs, drop, fifo, frame, compressed, multicast, then
    the same eight sent."""
    lines = DEV.read_text().splitlines()[2:]  # two header lines
    return {name.strip(): [int(x) for x in rest.split()] for name, rest in (line.split(":", 1) for line in lines)}


def interfaces() -> list[str]:
    """The network interfaces this process's namespace has."""
    return sorted(_table()) if DEV.is_file() else []


def sent_bytes(name: str) -> int:
    """Bytes ``name`` has sent since it came up."""
    return _table()[name][8]
