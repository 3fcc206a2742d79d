"""Activation memory: the bytes autograd keeps for backward, counted as the forward saves them.

Peak resident memory mixes in the allocator, the interpreter and the weights; what parallel layouts
change is what the forward pass leaves for backward. :class:`SavedBytes` counts each distinct storage
that autograd saves, leaving out the parameters themselves (a gathered copy of a weight counts).

    with SavedBytes(model.parameters()) as saved:
        loss = model(x, y)
    print(saved.bytes)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)  # a DTensor's own shard


class SavedBytes:
    def __init__(self, params) -> None:
        self._skip = {_local(p).untyped_storage().data_ptr() for p in params}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key not in self._skip and key not in self._seen and not _local(t).is_meta:
            self._seen.add(key)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def peak_memory_bytes() -> int:
    """Peak memory of this rank: device memory on CUDA, else the process's peak resident set."""
    import torch.distributed as dist

    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        return int(torch.cuda.max_memory_allocated())
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def resident_bytes() -> int:
    """This process's resident memory now (not its peak): what grows if a run keeps something every step."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best there is
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def anonymous_bytes() -> int | None:
    """The anonymous part of this process's resident set (``RssAnon``): what it allocated, without the pages of
    mapped files (torch's libraries), which the page cache drops and reads again under memory pressure and
    which made the resident set wander by tens of MB over a long run. None where /proc has no such line."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2  # glibc 2.33+
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


RELEASE_EVERY = 100  # steps between returns of malloc's free pages to the system (a trim costs 5-12 ms here)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


def release_free(step: int) -> bool:
    """Every ``RELEASE_EVERY`` steps, hand the pages glibc's malloc holds free back to the system; True if it did.

    Tensor storage on CPU comes from malloc, and glibc returns freed memory only from the top of each arena: a
    run whose allocations interleave (one step's activations, gloo's buffers on its own threads) leaves free
    holes that the resident set keeps. Measured on the default model (2 ranks, dense), bytes in use stayed at
    146.2 MB while one rank's free-but-held bytes went 58 → 101 MB in 750 steps; the resident set drifted
    ~8.5 KB a step over 5,000 steps in the soak (docs/benchmarks.md). ``malloc_trim`` gives those pages back;
    the next steps fault in only what they reuse."""
    trim = _malloc_trim()
    if step % RELEASE_EVERY or trim is None:
        return False
    trim(0)
    return True


def allocator_bytes() -> int | None:
    """Bytes the allocator has handed out and not had back: on CUDA torch's caching allocator; on CPU glibc's
    malloc (tensor storage lives there), its heap blocks in use plus its mmapped blocks. None without either.

    Beside :func:`resident_bytes` it tells a leak (both grow) from fragmentation (only the resident set grows)."""
    import torch.distributed as dist

    if torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return int(torch.cuda.memory_allocated())
    fn = _mallinfo2()
    if fn is None:
        return None
    info = fn()
    return int(info.uordblks + info.hblkhd)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local shard (FSDP's sharded weights and their state), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def table_memory_bytes(tables, dense_tables: list[tuple[torch.nn.Parameter, bool]], optimizer) -> int:
    """Bytes this rank holds for embedding tables: weights, optimizer state and gradients (dense tables)
    or shard, row-optimizer state and the rows pulled for the last batch (ps and allgather tables)."""
    total = tables.memory_bytes() if tables else 0
    for p, sparse_grad in dense_tables:
        state = optimizer.state.get(p, {})
        # A dense gradient of the whole table exists during every step (zero_grad frees it after).
        n = local(p).numel()  # a dense table under FSDP: this rank's shard
        grad = 0 if sparse_grad else n * p.element_size()
        total += n * p.element_size() + grad + sum(
            local(v).numel() * v.element_size() for v in state.values() if torch.is_tensor(v) and v.dim())
    return total


def model_state_bytes(params, optimizer) -> int:
    """Bytes of this rank's parameters and their optimizer state (what sharding over pp and tp divides)."""
    params = list(params)
    total = sum(local(p).numel() * p.element_size() for p in params)  # a sharded weight: this rank's shard
    for p in params:
        total += sum(local(v).numel() * v.element_size() for v in optimizer.state.get(p, {}).values()
                     if torch.is_tensor(v) and v.dim())
    return total



def _plain(t) -> bool:
    """A tensor with a storage of its own to count (a wrapper's, DTensor's, local tensor is what the operations
    below it make)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and not t.is_sparse and not t.is_meta


class PeakTensors(TorchDispatchMode):
    """The most bytes of tensor storage alive at once while it is entered: ``held`` (the bytes counted at entry,
    by default every tensor Python holds) and every storage an operation makes after, until it is freed. This
    is what a device allocator's peak counts (``torch.cuda.max_memory_allocated``), measured the same way on the
    CPU, where the resident set mixes in the interpreter, torch's libraries and malloc's free pages. Storages are
    counted once however many views share them (torch's ``MemTracker`` does the same per module, but refuses a
    module run more than once per step, as micro-batches run it). A tensor only C++ holds (gloo's own buffers)
    is not seen.

        with PeakTensors() as peak:
            engine.step(x, y, step)
        print(peak.bytes, peak.bytes - peak.entry)   # the peak, and what the step added at its peak

    ``counted``: the tensors whose bytes count at entry (a run's weights, gradients and optimizer state);
    every other tensor alive then (the dataset, a test's reference model) counts nothing: an operation's output
    that shares an input's storage (a view, an in-place or ``out=`` result) is not new, so an operation on such
    a tensor adds nothing. Without ``counted``, every tensor Python holds at entry counts (found by a walk over
    every object, which a long-lived process pays in seconds). ``extra``: bytes to count besides (table
    shards). The cycle collector waits while it is entered, so the peak does not move with its timing.
    """

    def __init__(self, counted=None, extra: int = 0) -> None:
        super().__init__()
        self._seen = WeakIdKeyDictionary()
        self.live = extra
        for t in counted or ():
            self._add(local(t))
        for t in gc.get_objects() if counted is None else ():
            if issubclass(type(t), torch.Tensor):  # type(), not isinstance: some objects' __class__ warns
                self._add(t)
        self.bytes = self.entry = self.live

    def __enter__(self):
        # the cycle collector would free tensors at moments of its own choosing, moving the peak from run to run
        self._collecting = gc.isenabled()
        gc.disable()
        return super().__enter__()

    def __exit__(self, *exc):
        if self._collecting:
            gc.enable()
        return super().__exit__(*exc)

    def restart(self) -> None:
        """From here, the peak of what is alive now and what operations make after (a step's second phase
        measured apart from its first)."""
        self.bytes = self.live

    def _add(self, t: torch.Tensor, count: bool = True) -> None:
        if not _plain(t):
            return
        storage = t.untyped_storage()
        if storage not in self._seen:
            self._seen[storage] = n = storage.nbytes() if count else 0
            if n:
                self.live += n
                weakref.finalize(storage, self._free, n)

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if _plain(t)}
        for t in tree_leaves(out):
            if _plain(t):  # a storage an input brought in is known; one the operation made counts
                self._add(t, count=id(t.untyped_storage()) not in inputs)
        self.bytes = max(self.bytes, self.live)
        return out


def held_tensors(module: torch.nn.Module, optimizer) -> list[torch.Tensor]:
    """What a rank holds between steps for its model: weights, buffers, gradients, the optimizer's state."""
    params = list(module.parameters())
    out = [*params, *module.buffers(), *(p.grad for p in params if p.grad is not None)]
    return out + [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
