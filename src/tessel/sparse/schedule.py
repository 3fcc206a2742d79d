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

:class:`Clock` records when each sparse collective was in flight and how long the trainer waited for
sparse traffic; their ratio is the share of sparse communication hidden behind computation.

    >>> touched = torch.tensor([False, True, True, False])
    >>> [m.tolist() for m in priority(torch.tensor([0, 2, 3]), touched)]
    [[True, False, True], [False, True, False]]
"""

from __future__ import annotations

import threading
import time

import torch


def priority(ids: torch.Tensor, touched: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks over ``ids``: (ready now, ready after this step's update). ``touched``: bool per row."""
    late = touched[ids]
    return ~late, late


class Clock:
    """Intervals during which sparse collectives were in flight, and the trainer's waits for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed: list[tuple[float, float]] = []
        self.waited = 0.0

    def sync(self, fn):
        """Run a blocking collective: all of its time is waited for."""
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        with self._lock:
            self._closed.append((t0, t1))
        self.waited += t1 - t0
        return out

    def launch(self, work):
        """Track an async collective from now until its future completes (on the backend's thread)."""
        t0 = time.perf_counter()

        def done(_):
            with self._lock:
                self._closed.append((t0, time.perf_counter()))

        work.get_future().add_done_callback(done)
        return work

    def wait(self, work) -> None:
        t0 = time.perf_counter()
        work.wait()
        self.waited += time.perf_counter() - t0

    def take(self) -> tuple[float, float]:
        """(seconds with any sparse collective in flight, seconds waited) since the last ``take``."""
        with self._lock:
            spans, self._closed = sorted(self._closed), []
        busy, end = 0.0, float("-inf")
        for a, b in spans:
            if b > end:
                busy += b - max(a, end)
                end = b
        waited, self.waited = self.waited, 0.0
        return busy, waited
