"""Fault injection on the emulated cluster: kill or stall a worker, or kill a whole host, at a chosen step.

A fault waits until the run's metrics.jsonl holds ``step`` records, then acts on host ``host``:
``kill`` (SIGKILL its worker), ``stop`` (SIGSTOP its worker: a stall, ended by SIGCONT after ``lasts`` seconds
if given) or ``host`` (SIGKILL everything in the host's cgroup, torchrun's agent included: the host is gone).
``Watch`` samples the metrics file, from which each fault's recovery (seconds until the first step after the
restart is logged) and recomputed steps follow::

    with EmulatedCluster(2, "1gbit") as c, Chaos(c, out, [Fault(10, 1, "kill")]) as chaos:
        c.run(commands, keep_going=True)
    chaos.report()    # [{"kind", "step", "resumed_from", "recomputed", "recover_s"}, ...]
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Fault:
    step: int
    host: int
    kind: str  # kill | stop | host
    lasts: float | None = None  # stop: seconds until SIGCONT (None: stalled until killed)
    at: float | None = None  # monotonic time it was injected
    done_steps: int | None = None  # records in metrics.jsonl when it was injected


def _records(metrics: Path) -> list[int]:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return []
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            break
    return steps


def _host_pids(cluster, host: int) -> list[int]:
    path = cluster.cgroup(host) / "cgroup.procs"
    try:
        return [int(p) for p in path.read_text().split()]
    except OSError:
        return []


def _worker(cluster, host: int) -> int | None:
    """The pid of the tessel worker on ``host`` (torchrun sets RANK for it, not for itself)."""
    for pid in _host_pids(cluster, host):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(e.startswith(b"RANK=") for e in env) and b"torch.distributed.run" not in cmd:
            return pid
    return None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Chaos:
    def __init__(self, cluster, out: Path, faults: list[Fault]):
        self.cluster, self.metrics, self.faults = cluster, Path(out) / "metrics.jsonl", faults
        self.samples: list[tuple[float, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Chaos:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        pending = list(self.faults)
        while not self._stop.is_set():
            steps = _records(self.metrics)
            now = time.monotonic()
            if not self.samples or steps != self.samples[-1][1]:
                self.samples.append((now, steps))
            if pending and len(steps) >= pending[0].step and self._inject(pending[0], len(steps)):
                pending.pop(0)
            time.sleep(0.01)

    def _inject(self, fault: Fault, done: int) -> bool:
        if fault.kind == "host":
            pids = _host_pids(self.cluster, fault.host)
        else:
            pid = _worker(self.cluster, fault.host)
            pids = [pid] if pid else []
        if not pids:
            return False  # between restarts: try again at the next sample
        sig = signal.SIGSTOP if fault.kind == "stop" else signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            if fault.kind == "stop" and fault.lasts is not None:
                threading.Timer(fault.lasts, _signal, (pid, signal.SIGCONT)).start()
        fault.at, fault.done_steps = time.monotonic(), done
        return True

    def report(self) -> list[dict]:
        """Per fault: the step it hit, the checkpoint step the job went on from, steps recomputed, seconds until
        the first step after the restart was logged."""
        out = []
        for fault in self.faults:
            if fault.at is None:
                out.append({"kind": fault.kind, "injected": False})
                continue
            after = [(t, s) for t, s in self.samples if t > fault.at]
            # the resumed run truncates metrics.jsonl to its checkpoint's step, then appends
            cut = next(((t, s) for t, s in after if len(s) < fault.done_steps), None)
            resumed_from = len(cut[1]) if cut else None
            first = next((t for t, s in after if cut and t >= cut[0] and len(s) > resumed_from), None)
            out.append({"kind": fault.kind, "host": fault.host, "step": fault.done_steps,
                        "resumed_from": resumed_from,
                        "recomputed": None if resumed_from is None else fault.done_steps - resumed_from,
                        "recover_s": None if first is None else round(first - fault.at, 1)})
        return out
