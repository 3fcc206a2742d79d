"""Start local worker processes with torch's elastic launcher (the API behind torchrun).

``tessel train --nproc N`` re-runs the same command line in N workers under a single-node c10d
rendezvous, exactly as ``torchrun --standalone --nproc-per-node N -m tessel train ...`` would (``tessel run
script.py`` starts a script the same way, as ``torchrun ... script.py`` would); a worker
knows it is one by the variables torchrun sets. If any worker dies or fails, the agent stops the
others and we print one line per failed rank instead of torch's report; with ``max_restarts`` it first
starts every worker again, up to that many times, and they continue from the newest intact checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import uuid
from dataclasses import fields

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def in_worker() -> bool:
    """True inside a process that torchrun (or tessel's launcher) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def describe(rank: int, failure) -> str:
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-failure.exitcode}"
    elif failure.exitcode == 143:
        how = "stopped on SIGTERM after saving a checkpoint"
    else:
        how = f"exited with code {failure.exitcode}"
    return f"tessel: rank {rank} (pid {failure.pid}) {how}; the job was stopped"


def _children() -> set[int]:
    """This process's live children (the agent starts the workers as its own, in this process)."""
    me, found = os.getpid(), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                found.add(int(d))
    return found


class _Continue(threading.Thread):
    """Once a worker has ended, SIGCONT the others. torch's agent stops the rest of a failed group with SIGTERM and
    a fixed 30 s grace before SIGKILL (torch 2.13's ``_stop_workers``); a SIGSTOPped rank cannot take SIGTERM until
    it runs again, so the job waited out the grace. Continued, it takes the signal or finds its peer gone and ends
    in seconds. A SIGCONT to a running process does nothing."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="tessel-continue")
        self.done = threading.Event()

    def run(self) -> None:
        before: set[int] = set()
        while not self.done.wait(0.2):
            now = _children()
            if before - now:
                for pid in now:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGCONT)
            before = now


def launch(args: list[str], nproc: int, verbose: bool = False, max_restarts: int = 0,
           program: tuple[str, ...] = ("-m", "tessel")) -> int:
    """Run ``python <program> <args>`` (default ``python -m tessel <args>``) in ``nproc`` local workers; the
    job's exit code."""
    if not verbose:
        # The agent logs a multi-screen report on failure; describe() says the same in one line.
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    threads = max(1, (os.cpu_count() or 1) // nproc)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # one rendezvous store per restart: torch's shared one still holds the dead attempt's addresses (#135712)
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Grace period before SIGKILL when the launcher is stopped: the workers save a checkpoint after their
    # current step (tessel.train.preempt). When a worker fails, torch 2.13's process context closes the
    # others with its own fixed 30 s grace instead, which a rank that cannot take SIGTERM uses up in full:
    # a SIGSTOPped one is continued (_Continue), one stuck in the kernel is not. Releases before 2.13 have no
    # such setting and wait their own 30 s.
    grace = {"shutdown_timeout": 30} if "shutdown_timeout" in {f.name for f in fields(LaunchConfig)} else {}
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"tessel-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=max_restarts, monitor_interval=0.2, **grace)
    watcher = _Continue()
    watcher.start()
    try:
        elastic_launch(config, sys.executable)(*program, *args)
    except ChildFailedError as e:
        failures = sorted(e.failures.items())
        # Workers report their error through torchelastic's error file; say each distinct one once.
        messages = dict.fromkeys(f.message for _, f in failures if isinstance(f.message, str)
                                 and f.message.startswith("tessel"))
        for message in messages:
            print(message, file=sys.stderr)
        for rank, failure in failures:
            print(describe(rank, failure), file=sys.stderr)
        # Exit 2 means "bad input" (a worker raised TesselError); ranks the agent stopped in
        # consequence show up as signals and do not change that.
        return 2 if any(f.exitcode == 2 for f in e.failures.values()) else 1
    except SignalException as e:  # the launcher itself was told to stop; the workers saved and stopped
        print(f"tessel: stopped by {signal.Signals(e.sigval).name}; continue with --resume", file=sys.stderr)
        return 128 + int(e.sigval)
    finally:
        watcher.done.set()
    return 0
