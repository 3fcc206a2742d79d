"""Run functions on a persistent N-rank gloo world: started once, reused by many tests.

Starting a world costs seconds on 2 cores (its ranks fork from a server that imported torch and tessel once;
each forms the gloo group), so each size is started once per session and every test sends it a function to run
on all ranks. A function that fails on any rank breaks the world (peers
may be stuck in a collective); the next ``run`` starts a fresh one.

    world = World(2)
    results = world.run(check_fn, arg)   # check_fn(arg) on every rank; list of results by rank
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
from datetime import timedelta

import torch.multiprocessing as mp

TIMEOUT = 60.0  # seconds a collective may wait inside tests (8 ranks share 2 cores: a slow peer is not a dead one)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, size: int, port: int, tasks, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=TIMEOUT))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            from tessel import comm

            comm.counter.reset()
            out = fn(*args, **kwargs)
            try:
                _drop_groups(dist)
            except Exception:  # noqa: BLE001 - a task that broke a group (timeout tests) marks the world broken
                pass
            results.put((rank, True, out))
        except BaseException:  # noqa: B036 - report everything, the test decides
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


def _drop_groups(dist) -> None:
    """Destroy the process groups a task made (its meshes'). Each gloo group keeps a thread per process that
    wakes on its own; left alive over a session's hundreds of meshes they were thousands of threads, a load
    average above 100 and every later test several times slower. Runs on every rank after the task, so no
    peer still uses them."""
    dist.barrier()
    world = dist.GroupMember.WORLD
    for pg in list(dist.distributed_c10d._world.pg_map):
        if pg is not world:
            dist.destroy_process_group(pg)


class World:
    def __init__(self, size: int) -> None:
        ctx = mp.get_context("forkserver")
        # forked from a server that imported these once: a spawned rank spent ~3 s of CPU importing them, and a
        # world of 8 on 2 cores ~15 s before its first task
        # (Hugging Face's model files too, which 8 ranks of the hf tests imported each; the forkserver skips a
        # module that does not import, so a machine without the extra loses nothing)
        ctx.set_forkserver_preload(["torch", "torch.distributed", "tessel.trainer", "tessel.cli",
                                    "transformers.models.llama.modeling_llama",
                                    "transformers.models.gpt2.modeling_gpt2"])
        self.size = size
        self.tasks = [ctx.Queue() for _ in range(size)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_worker, args=(r, size, port, self.tasks[r], self.results), daemon=True)
                      for r in range(size)]
        for p in self.procs:
            p.start()
        self.broken = False

    def run(self, fn, *args, timeout: float = 120.0, **kwargs) -> list:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order, or AssertionError."""
        for q in self.tasks:
            q.put((fn, args, kwargs))
        out, errors = [None] * self.size, []
        for _ in range(self.size):
            try:
                rank, ok, value = self.results.get(timeout=timeout)
            except queue.Empty:
                self.broken = True
                raise AssertionError(f"{fn.__name__} did not finish on all {self.size} ranks in {timeout}s") from None
            if ok:
                out[rank] = value
            else:
                errors.append(f"--- rank {rank} ---\n{value}")
        if errors:
            self.broken = True
            raise AssertionError(f"{fn.__name__} failed on {len(errors)} rank(s):\n" + "\n".join(errors))
        return out

    def close(self) -> None:
        for q, p in zip(self.tasks, self.procs):
            if p.is_alive() and not self.broken:
                q.put(None)
        for p in self.procs:
            if self.broken:  # its ranks may wait in a collective for a peer that left: nothing to wait for
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
