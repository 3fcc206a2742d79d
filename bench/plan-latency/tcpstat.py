"""A host's TCP counters, for the bench scripts that take a step or a call apart (where.py, ../fsdp-rate)."""


def tcp_counters() -> dict[str, int]:
    """This network namespace's Tcp and TcpExt counters (retransmits, timeouts, delayed ACKs, ...)."""
    out = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        lines = [ln.split() for ln in open(path)]
        for head, vals in zip(lines[::2], lines[1::2]):
            if head[0] in ("Tcp:", "TcpExt:"):
                out.update({f"{head[0]}{k}": int(v) for k, v in zip(head[1:], vals[1:]) if v.lstrip("-").isdigit()})
    return out
