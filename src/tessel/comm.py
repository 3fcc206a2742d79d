"""The only module of tessel that calls torch.distributed collectives; it counts every byte.

Each call names a *channel* (``dp.dense``, ``pp``, ``tp``, ``tp.head``, ``tp.loss``, ``ps.*``, ``a2a.*``, ``meta``,
...). The counter of this rank adds the bytes the rank sends and receives under the algorithm that
moves the fewest bytes:

=====================  =========================================  =================================
collective             sent by each rank                          received by each rank
=====================  =========================================  =================================
all_reduce             2(P-1)/P · n        (ring)                 same
all_gather             (P-1) · n_in        (ring)                 same
reduce_scatter         (P-1) · n_out       (direct, see below)    same
all_to_all             bytes of the splits bound for other ranks  bytes of the splits from others
broadcast              n unless last in the ring from src         n unless src
send / recv            n                                          n
=====================  =========================================  =================================

(n: bytes of the tensor; P: ranks in the group.) Bytes a rank keeps for itself are never counted.
On gloo, torch's reduce_scatter is an all_reduce in disguise (twice the traffic), so reduce_scatter
here is an all_to_all followed by a local sum, which moves exactly the bytes in the table.

A failed or timed-out collective raises ``CommError`` naming the rank, the collective and the channel.

Example::

    from tessel import comm
    comm.all_reduce(grad, "dp.dense", group=dp_group)
    print(comm.counter.end_step())   # {'dp.dense': {'sent': ..., 'recv': ...}}
"""

from __future__ import annotations

import contextlib
import json
import re
import traceback
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .errors import CommError


class ByteCounter:
    """Bytes sent and received by this rank, per channel, for the current step and in total; and the calls of the
    current step (each pays a collective's fixed costs, whatever its bytes)."""

    def __init__(self) -> None:
        self._step: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._calls: dict[str, int] = defaultdict(int)

    def add(self, channel: str, sent: int, recv: int) -> None:
        for table in (self._step, self._total):
            table[channel][0] += int(sent)
            table[channel][1] += int(recv)
        self._calls[channel] += 1

    def calls(self) -> dict[str, int]:
        """Calls per channel since the last ``end_step`` (a point-to-point send and its receive count one each)."""
        return dict(sorted(self._calls.items()))

    def step(self) -> dict[str, dict[str, int]]:
        """Bytes since the last ``end_step``, without resetting."""
        return {c: {"sent": s, "recv": r} for c, (s, r) in sorted(self._step.items())}

    def end_step(self) -> dict[str, dict[str, int]]:
        """Bytes of the step that just ended; the step counter starts again from zero."""
        out = self.step()
        self._step.clear()
        self._calls.clear()
        return out

    def total(self) -> dict[str, dict[str, int]]:
        return {c: {"sent": s, "recv": r} for c, (s, r) in sorted(self._total.items())}

    def reset(self) -> None:
        self._step.clear()
        self._total.clear()
        self._calls.clear()


counter = ByteCounter()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Dry:
    """A group of ``size`` ranks that exists in this process only: every collective on it gives a result of the
    right shape, filled from this rank's own data, and moves and counts nothing. The planner runs
    tensor-parallel layers on it to measure what one rank of the grid holds (its activations, gathered blocks)
    before any worker starts, as torchtitan's memory estimate runs on torch's fake backend."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return f"Dry({self.size})"


def _size(group) -> int:
    return group.size if isinstance(group, Dry) else dist.get_world_size(group)


def group_size(group) -> int:
    """Ranks in ``group`` (None: the default group; a :class:`Dry` one: its stated size)."""
    return _size(group)


def _dry(what: str, channel: str, async_op: bool, fill=None):
    """A collective on a :class:`Dry` group: the local stand-in ``fill`` (if any), nothing sent or counted."""
    if fill is not None:
        fill()
    return _Work(None, what, channel) if async_op else None


def device(group=None) -> torch.device:
    """Where a tensor this rank makes for a collective must live: the current GPU under nccl (it takes nothing
    else), the CPU otherwise (gloo takes CPU tensors for every collective, CUDA ones for some)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Work:
    """An async handle whose ``wait`` reports failures like the blocking calls do."""

    def __init__(self, work, what: str, channel: str, then=None) -> None:
        self._work, self._what, self._channel, self._then = work, what, channel, then

    def wait(self) -> None:
        with guard(self._what, self._channel):
            if self._work is not None:
                self._work.wait()
        if self._then is not None:
            self._then()
            self._then = None

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future()


class guard:
    """Turn a backend error (timeout, closed connection) into a one-line CommError."""

    def __init__(self, what: str, channel: str) -> None:
        self.what, self.channel = what, channel

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or not isinstance(exc, (RuntimeError, dist.DistError)) or isinstance(exc, CommError):
            return False
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else typ.__name__
        timed_out = "timed out" in str(exc).lower() or "timeout" in str(exc).lower()
        why = "timed out: a peer rank is dead or stuck" if timed_out else "failed: a peer rank failed or left"
        if not (timed_out or isinstance(exc, dist.DistError) or _BACKEND.search(str(exc))):
            # a guarded block also computes (a pipeline step): an error of this rank's own, not of a peer
            frames = traceback.extract_tb(tb)  # the deepest of tessel's own frames says where
            where = next((f for f in reversed(frames) if f"{Path(__file__).parent.name}/" in f.filename), frames[-1])
            why = f"failed on this rank at {Path(where.filename).name}:{where.lineno}"
        rank = dist.get_rank() if dist.is_initialized() else "?"
        raise CommError(f"rank {rank}: {self.what} on channel '{self.channel}' {why} ({first})") from exc


# what a backend says when the other end went away (gloo's transport, nccl, the store)
_BACKEND = re.compile(r"gloo|nccl|connection|socket|peer|store|broken pipe", re.IGNORECASE)


def _run(what: str, channel: str, call, async_op: bool, then=None):
    with guard(what, channel):
        work = call()
    if async_op:
        return _Work(work, what, channel, then)
    if then is not None:
        then()
    return None


HALF = (torch.bfloat16, torch.float16)
# torch 2.13's name for one gather into one tensor; the releases before it (2.11 on some GPU machines) call it this
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _wire(group, *tensors: torch.Tensor):
    """nccl moves GPU tensors only: CPU ones tessel keeps on the host (access counts, sizes, flags) cross through
    the current GPU and are copied back when the collective is done. Returns (the tensors to pass, copy-back)."""
    if all(t.device.type != "cpu" for t in tensors) or dist.get_backend(group) != "nccl":
        return tensors, None
    on = tuple(t.to(device(group)) for t in tensors)
    return on, lambda: [t.copy_(o) for t, o in zip(tensors, on) if o is not t]


def _all_reduce_half(tensor: torch.Tensor, channel: str, group) -> None:
    """A half-width sum as reduce-scatter then all-gather, each in the tensor's width (the ring's bytes), the
    sum accumulated in fp32 and rounded once: a ring all-reduce in bf16 would round after every hop."""
    p = _size(group)
    flat = tensor.reshape(-1)
    pad = (-flat.numel()) % p
    padded = torch.cat([flat, flat.new_zeros(pad)]) if pad else flat
    part = torch.empty(padded.numel() // p, dtype=torch.float32, device=tensor.device)
    reduce_scatter(part, padded, channel, group)
    whole = padded.new_empty(padded.numel())
    all_gather_into(whole, part.to(tensor.dtype), channel, group)
    tensor.copy_(whole[: flat.numel()].view_as(tensor))


def all_reduce(tensor: torch.Tensor, channel: str, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    """In-place all_reduce of ``tensor`` over ``group`` (a half-width sum: see :func:`_all_reduce_half`)."""
    p = _size(group)
    if isinstance(group, Dry):  # the sum of p copies of this rank's values is not needed: shapes are
        return _dry("all_reduce", channel, async_op)
    if tensor.dtype in HALF and op == dist.ReduceOp.SUM and p > 1 and not async_op:
        return _all_reduce_half(tensor, channel, group)
    moved = 2 * (p - 1) * _nbytes(tensor) // p
    counter.add(channel, moved, moved)
    (on,), back = _wire(group, tensor)
    return _run("all_reduce", channel, lambda: dist.all_reduce(on, op=op, group=group, async_op=async_op),
                async_op, back)


def all_gather_into(output: torch.Tensor, tensor: torch.Tensor, channel: str, group=None, async_op: bool = False):
    """Gather every rank's ``tensor`` into ``output`` (P times its size along dim 0), rank order."""
    p = _size(group)
    if output.numel() != p * tensor.numel():
        raise ValueError(f"all_gather output has {output.numel()} elements, expected {p} x {tensor.numel()}")
    if isinstance(group, Dry):
        return _dry("all_gather", channel, async_op,
                    lambda: output.view(p, -1).copy_(tensor.reshape(1, -1).expand(p, -1)))
    moved = (p - 1) * _nbytes(tensor)
    counter.add(channel, moved, moved)
    (out, on), back = _wire(group, output, tensor)
    return _run("all_gather", channel,
                lambda: _ALL_GATHER(out, on, group=group, async_op=async_op), async_op, back)


def all_gather(tensor: torch.Tensor, channel: str, group=None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), as a list in rank order."""
    p = _size(group)
    out = tensor.new_empty((p * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() else (p,))
    all_gather_into(out, tensor.reshape(-1) if tensor.dim() == 0 else tensor, channel, group)
    return list(out.chunk(p)) if tensor.dim() else [x.reshape(()) for x in out]


def all_gather_object(obj, channel: str, group=None) -> list:
    """Every rank's JSON-serialisable ``obj``, in rank order (JSON, never pickle, crosses the wire)."""
    dev = device(group)
    data = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8, device=dev)
    sizes = [int(n) for n in all_gather(torch.tensor([data.numel()], device=dev), channel, group)]
    buf = torch.zeros(max(sizes), dtype=torch.uint8, device=dev)
    buf[: data.numel()] = data
    parts = all_gather(buf, channel, group)
    return [json.loads(bytes(part[:n].tolist())) for part, n in zip(parts, sizes)]


def all_to_all(
    output: torch.Tensor,
    tensor: torch.Tensor,
    channel: str,
    output_splits: Sequence[int] | None = None,
    input_splits: Sequence[int] | None = None,
    group=None,
    async_op: bool = False,
):
    """Uneven all_to_all along dim 0: ``input_splits[j]`` rows go to rank j, ``output_splits[j]`` come from j."""
    if isinstance(group, Dry):  # (what a reduce-scatter sums: p copies of this rank's terms)
        same = output.numel() == tensor.numel()
        return _dry("all_to_all", channel, async_op,
                    lambda: output.copy_(tensor.view_as(output)) if same else output.zero_())
    p, me = _size(group), dist.get_rank(group)
    row_in = _nbytes(tensor) // max(tensor.shape[0], 1) if tensor.dim() else 0
    row_out = _nbytes(output) // max(output.shape[0], 1) if output.dim() else 0
    ins = list(input_splits) if input_splits is not None else [tensor.shape[0] // p] * p
    outs = list(output_splits) if output_splits is not None else [output.shape[0] // p] * p
    if sum(ins) != tensor.shape[0] or sum(outs) != output.shape[0] or len(ins) != p or len(outs) != p:
        raise ValueError(f"all_to_all splits {ins} -> {outs} do not fit tensors of {tensor.shape[0]} -> "
                         f"{output.shape[0]} rows over {p} ranks")
    counter.add(channel, (sum(ins) - ins[me]) * row_in, (sum(outs) - outs[me]) * row_out)
    (out, on), back = _wire(group, output, tensor)
    return _run(
        "all_to_all", channel,
        lambda: dist.all_to_all_single(out, on, outs, ins, group=group, async_op=async_op), async_op, back)


def reduce_scatter(output: torch.Tensor, tensor: torch.Tensor, channel: str, group=None, async_op: bool = False):
    """Sum ``tensor`` over ranks and keep this rank's 1/P slice (dim 0) in ``output``.

    Done as all_to_all + local sum: (P-1)/P of the input crosses the network, not 2(P-1)/P. With
    ``async_op`` the sum happens in the handle's ``wait``.
    """
    p = _size(group)
    if tensor.shape[0] != p * output.shape[0]:
        raise ValueError(f"reduce_scatter input has {tensor.shape[0]} rows, expected {p} x {output.shape[0]}")
    received = torch.empty_like(tensor)
    work = all_to_all(received, tensor.contiguous(), channel, group=group, async_op=async_op)
    # the terms cross in their own width and are summed in the output's (fp32 for bf16 terms: no sum rounds twice)
    total = lambda: torch.sum(received.view(p, *output.shape), dim=0, dtype=output.dtype, out=output)  # noqa: E731
    if not async_op:
        total()
        return None
    return _Work(work, "reduce_scatter", channel, then=total)


def broadcast(tensor: torch.Tensor, src: int, channel: str, group=None, async_op: bool = False):
    """Broadcast from global rank ``src``; counted as a ring rooted at src."""
    p = _size(group)
    root = dist.get_group_rank(group, src) if group is not None else src
    pos = (dist.get_rank(group) - root) % p
    n = _nbytes(tensor)
    counter.add(channel, n if pos < p - 1 else 0, n if pos > 0 else 0)
    (on,), back = _wire(group, tensor)
    return _run("broadcast", channel, lambda: dist.broadcast(on, src, group=group, async_op=async_op),
                async_op, back)


def _p2p(group, tensor: torch.Tensor):
    """gloo sends and receives host memory only: a GPU tensor (ranks sharing a GPU over gloo) crosses through a
    host copy. Returns (the tensor to pass, copy-back into ``tensor`` once received, or None)."""
    if not tensor.is_cuda or dist.get_backend(group) != "gloo":
        return tensor, None
    host = tensor.cpu()
    return host, lambda: tensor.copy_(host)


def send(tensor: torch.Tensor, dst: int, channel: str, group=None) -> None:
    counter.add(channel, _nbytes(tensor), 0)
    on, _ = _p2p(group, tensor)
    _run("send", channel, lambda: dist.send(on, dst, group=group), False)


def recv(tensor: torch.Tensor, src: int, channel: str, group=None) -> None:
    counter.add(channel, 0, _nbytes(tensor))
    on, back = _p2p(group, tensor)
    _run("recv", channel, lambda: dist.recv(on, src, group=group), False, back)


def isend(tensor: torch.Tensor, dst: int, channel: str, group=None) -> _Work:
    counter.add(channel, _nbytes(tensor), 0)
    on, _ = _p2p(group, tensor)
    return _run("isend", channel, lambda: dist.isend(on, dst, group=group), True)


def irecv(tensor: torch.Tensor, src: int, channel: str, group=None) -> _Work:
    counter.add(channel, 0, _nbytes(tensor))
    on, back = _p2p(group, tensor)
    return _run("irecv", channel, lambda: dist.irecv(on, src, group=group), True, back)


def batch_isend_irecv(ops: Sequence[tuple[str, torch.Tensor, int]], channel: str, group=None) -> list[_Work]:
    """Post sends and receives together: ``ops`` holds ("send" | "recv", tensor, peer global rank)."""
    p2p, backs = [], []
    for kind, tensor, peer in ops:
        if kind not in ("send", "recv"):
            raise ValueError(f"p2p op '{kind}' is invalid; valid: send, recv")
        counter.add(channel, _nbytes(tensor) if kind == "send" else 0, _nbytes(tensor) if kind == "recv" else 0)
        on, back = _p2p(group, tensor)
        p2p.append(dist.P2POp(dist.isend if kind == "send" else dist.irecv, on, peer, group=group))
        backs.append(back if kind == "recv" else None)
    with guard("batch_isend_irecv", channel):
        works = dist.batch_isend_irecv(p2p) if p2p else []
    return [_Work(w, "batch_isend_irecv", channel, then) for w, then in zip(works, backs)]


# seconds the other ranks wait out work one rank does for all (rank 0's planner profile, stage cut, memory
# prediction, checkpoint hashes): on 4 hosts of half a core the planner's profile of the default model took 33.4 s,
# past the collectives' own 30 s timeout
ONE_RANKS_WORK = 900.0


@contextlib.contextmanager
def patience(seconds: float = ONE_RANKS_WORK, group=None):
    """Collectives on ``group`` (the world by default) inside the block wait up to ``seconds`` (never less than the
    group's own timeout), then the group's own timeout again. For a wait on one rank's long work: the group's
    timeout is sized for a step's collectives, and a peer that dies still ends the wait at once (its connection
    closes); only a stuck one takes the whole ``seconds``."""
    pg = group or dist.group.WORLD
    backend = pg._get_backend(device(group))
    before = getattr(getattr(backend, "options", None), "_timeout", None)
    if before is None or before.total_seconds() >= seconds:  # a backend without a settable timeout, or long enough
        yield
        return
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds), pg)
    try:
        yield
    finally:
        dist.distributed_c10d._set_pg_timeout(before, pg)


def from_rank_0(obj, channel: str = "meta", group=None):
    """Rank 0's JSON-serialisable ``obj`` on every rank of ``group``, where rank 0 made it alone (a plan, a stage
    cut, a checkpoint search) and the others wait out that work (:func:`patience`)."""
    with patience(group=group):
        return all_gather_object(obj, channel, group)[0]


def barrier(channel: str = "meta", group=None) -> None:
    """Wait for every rank of ``group``; moves no counted payload."""
    _run("barrier", channel, lambda: dist.barrier(group=group), False)


def ddp_comm_hook(channel: str = "dp.dense", dtype: torch.dtype | None = None):
    """A DDP communication hook that averages each gradient bucket through this module.

    Register with ``ddp_model.register_comm_hook(dp_group, ddp_comm_hook())``: DDP's own gradient
    traffic is then counted on ``channel`` like every other byte. ``dtype`` (bf16, when asked): each bucket
    crosses in it and is summed in fp32 (see :class:`_HalfSum`), then widened back into the gradients.
    """
    half = _HalfSum(channel, dtype) if dtype is not None else None

    def hook(group, bucket):  # no annotations: DDP checks them and this module defers them
        buf = bucket.buffer()
        if half is not None and buf.dtype != dtype:
            return half(group, bucket)
        buf.div_(_size(group))
        work = all_reduce(buf, channel, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    return hook


class _HalfSum:
    """A bucket's average with half-width terms and an fp32 sum, rounded once, in the ring's bytes.

    torch's ``bf16_compress_hook`` lets the backend sum in bf16, which rounds at every hop. Here each bucket is
    reduce-scattered (its bf16 terms cross, each rank sums its slice in fp32) and then gathered in bf16 (both
    all-to-alls, since the slices may be uneven).
    The all-gather cannot be issued from the reduce-scatter's completion callback: those run on the backend's
    threads in a different order on each rank, and gloo then deadlocks. So every collective is issued here, on
    the autograd thread, in DDP's bucket order (the same on every rank): bucket k's hook starts its
    reduce-scatter and then finishes bucket k-1 (waits for its slice, starts its all-gather), so each
    reduce-scatter overlaps the next bucket's backward; the last bucket finishes itself. The slices are
    uneven where the bucket does not split evenly, so no padding crosses: over all ranks, a ring's bytes.
    """

    def __init__(self, channel: str, dtype: torch.dtype) -> None:
        self.channel, self.dtype = channel, dtype
        self.pending = None  # the bucket whose reduce-scatter is in flight and all-gather not yet issued

    def __call__(self, group, bucket) -> torch.futures.Future:
        buf = bucket.buffer()
        p = _size(group)
        low = buf.reshape(-1).to(self.dtype).div_(p)  # (n,) this rank's terms, in the wire's width
        n = low.numel()
        sizes = [n // p + (j < n % p) for j in range(p)]  # slice j is summed on rank j
        mine = sizes[dist.get_rank(group)]
        terms = low.new_empty(p * mine)  # (p * mine,) every rank's terms of this rank's slice
        sent = all_to_all(terms, low, self.channel, [mine] * p, sizes, group, async_op=True)
        done = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)
        # a backward that failed part-way left its bucket behind; DDP starts every backward at bucket 0
        previous = self.pending if bucket.index() > 0 else None
        self.pending = (group, buf, low, sizes, terms, sent, done)
        if previous is not None:
            self._gather(*previous)
        if bucket.is_last():
            self._gather(*self.pending)
            self.pending = None
        return done

    def _gather(self, group, buf, low, sizes, terms, sent, done) -> None:
        p = _size(group)
        sent.wait()
        part = terms.view(p, -1).sum(0, dtype=torch.float32).to(self.dtype)  # (mine,) rounded once
        whole = low.new_empty(low.numel())  # (n,) every rank's rounded slice, in rank order
        work = all_to_all(whole, part.repeat(p), self.channel, sizes, [part.numel()] * p, group, async_op=True)

        def finish(fut):
            try:
                fut.value()
                done.set_result(buf.copy_(whole.view_as(buf)))
            except Exception as exc:  # a failed or timed-out gather reaches DDP's wait, not a lost callback
                done.set_exception(exc)

        work.get_future().then(finish)
