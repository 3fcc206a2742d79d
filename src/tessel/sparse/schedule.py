"""2-D communication scheduling for ``alltoall`` tables (EmbRace): the priority rule and the clock
that measures the overlap. The table carries the schedule out (``AllToAllTable._track``, ``prefetch``,
``launch_next`` and ``update`` in :mod:`tessel.sparse.alltoall`).

Two axes, both keeping the update exactly synchronous:

- *inside an iteration*: a table's gradient exchange starts from an autograd hook the moment its row
  gradients exist (the sampled-softmax table's at the start of the backward pass), so it travels while
  the rest of the backward pass and the dense all-reduce run; the engine also applies the row update
  and sends the next rows before the dense optimizer step instead of after it.
- *across iterations*: for a table fed straight from the batch (the input embedding), the next batch's
  ids go to the owners at the start of this step, and each owner answers in priority order
  (:func:`priority`): rows this step does not touch are final already and travel during this step's
  compute; rows it does touch follow right after the owner's update, ahead of any other traffic of the
  next step. The next forward waits only for what arrives after the update.

:class:`Clock` records when each sparse collective was in flight, how long the trainer waited for
sparse traffic and for what (:data:`WAITS`), and the tables' own work outside those waits; busy and waited
give the share of sparse communication hidden behind computation, the rest says where the scheduled path's
time goes.

    >>> touched = torch.tensor([False, True, True, False])
    >>> [m.tolist() for m in priority(torch.tensor([0, 2, 3]), touched)]
    [[True, False, True], [False, True, False]]
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch

# What the trainer waits for, one key each: the route (ids to their owners, and the owners' counts), rows sent
# when asked (or, scheduled, the next step's rows final before the update), the rows that could travel only
# after the owner's update (scheduled, across iterations), and the row gradients going back.
WAITS = ("ids", "rows", "late_rows", "grads")


def priority(ids: torch.Tensor, touched: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks over ``ids``: (ready now, ready after this step's update). ``touched``: bool per row."""
    late = touched[ids]
    return ~late, late


class Clock:
    """Intervals during which sparse collectives were in flight, the trainer's waits for them by what it waited
    for (:data:`WAITS`), and the seconds spent inside the tables' own calls (``inside``).

    A loop that never calls ``take`` (a user's own, under ``tessel.prepare``) must not grow it: past ``KEEP``
    intervals the older ones are folded into a busy total (their union), so it holds at most ``KEEP``.

        >>> c = Clock()
        >>> for i in range(3 * Clock.KEEP):
        ...     c._close(float(i), i + 0.5)
        >>> len(c._closed) <= Clock.KEEP, c.take()
        (True, (384.0, {}, 0.0))
    """

    KEEP = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed: list[tuple[float, float]] = []
        self._folded = 0.0  # busy seconds of intervals folded away (see KEEP)
        self.waited: dict[str, float] = {}
        self._inside, self._depth = 0.0, 0

    def _close(self, t0: float, t1: float) -> None:
        with self._lock:
            self._closed.append((t0, t1))
            if len(self._closed) > self.KEEP:
                old = _union(sorted(self._closed))
                # the last merged span stays: a collective launched earlier may still close inside it
                self._folded += sum(b - a for a, b in old[:-1])
                self._closed = old[-1:]

    def _waited(self, what: str, seconds: float) -> None:
        self.waited[what] = self.waited.get(what, 0.0) + seconds

    def sync(self, fn, what: str):
        """Run a blocking collective: all of its time is waited for (as ``what``, one of :data:`WAITS`)."""
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        self._close(t0, t1)
        self._waited(what, t1 - t0)
        return out

    def launch(self, work):
        """Track an async collective from now until its future completes (on the backend's thread)."""
        t0 = time.perf_counter()

        def done(_):
            self._close(t0, time.perf_counter())

        work.get_future().add_done_callback(done)
        return work

    def wait(self, work, what: str) -> None:
        t0 = time.perf_counter()
        work.wait()
        self._waited(what, time.perf_counter() - t0)

    @contextmanager
    def inside(self):
        """Time a table's call (nested calls count once): its work is this less the waits within it."""
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._inside += time.perf_counter() - t0

    def take(self) -> tuple[float, dict[str, float], float]:
        """Since the last ``take``: (seconds with any sparse collective in flight, seconds waited by what,
        seconds of the tables' own work: inside their calls and not waiting)."""
        with self._lock:
            spans, self._closed = sorted(self._closed), []
            busy, self._folded = self._folded + sum(b - a for a, b in _union(spans)), 0.0
        waited, self.waited = self.waited, {}
        inside, self._inside = self._inside, 0.0
        return busy, waited, max(0.0, inside - sum(waited.values()))


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted ``spans`` merged where they overlap."""
    out: list[tuple[float, float]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
