"""The cost model behind ``--sparse auto``: predicted bytes and time of each way to move one table.

Per table and step, from the sample batches (means over ranks): k unique rows per rank, u unique rows
over all ranks, u_h per host, the share ``late`` of the next batch's unique rows that this batch also
touches. Table V x d, b bytes per element of a row or row gradient as it crosses (bf16 under mixed precision)
and B of the table's own (a dense gradient is reduced at full width), i = 8 bytes per id, N ranks on H hosts
(L = N/H per host). Bytes are what one host sends over its link per step:

    dense      L·2(N-1)/N·V·d·B                      1 collective (inside DDP's buckets)
    allgather  L·(N-1)·k·(d·b+i)                      3 collectives
    ps         L·(N-1)/N·k·(2d·b+2i), or with local aggregation (H-1)/H·u_h·(2d·b+2i)    6 collectives
    alltoall   column: L·[(N-1)·k·i + 2(N-1)/N·k·d·b]   row: L·(N-1)/N·k·(2d·b+i)          4 collectives

A table that follows another (looked up with the very same ids right after a column-split one that is not fetched
ahead: a sampled softmax's bias after its weight) takes that table's route under either split: its ids do not cross
(the i terms go) and its two id collectives are not run.

Time = bytes/rate + collectives·latency + updated elements·c, where the updated elements are V·d
(dense: the dense optimizer walks the whole table), min(V, N·k)·d (allgather: every rank applies every
rank's rows) and u·d/N (ps, alltoall: each owner its share). Scheduled ``alltoall`` exposes only its
critical path: the next batch's late rows (fetched after the update) for a table fed from the batch,
the whole forward exchange otherwise, plus whatever of the rest exceeds the step's compute (three
times the measured forward pass) it hides behind. The rate, the latency and c are measured on the
job's own group at start-up (:func:`probe`) unless the rate is given.

    >>> s = Sparsity(rows=1000, dim=64, elem=4, k=50, u=150, u_host=50, late=0.3, fed=True)
    >>> est = estimate(s, ranks=4, hosts=4, link=Link(rate=125e6, latency=1e-3, per_elem=1e-9), compute=0.05)
    >>> min(est, key=lambda e: est[e].time), round(est["dense"].bytes / 2**10)
    ('alltoall/column', 375)
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import comm
from ..errors import ConfigError
from .rowopt import RowOptimizer

ID_BYTES = 8


@dataclass
class Link:
    rate: float  # bytes per second of one host's link
    latency: float  # seconds per collective
    per_elem: float  # seconds per table element a row optimizer updates
    source: str = "measured"


@dataclass
class Sparsity:
    rows: int
    dim: int
    elem: int
    k: float  # unique rows per rank per step
    u: float  # unique rows over all ranks per step
    u_host: float  # unique rows per host per step
    late: float  # share of the next batch's unique rows this batch touches
    fed: bool  # ids come straight from the batch (prefetchable)
    wire: int = 0  # bytes per element of a looked-up row or row gradient on the wire (bf16 under mixed precision;
    # 0: elem)
    follows: bool = False  # the route comes with the column-split table read with the same ids before it


@dataclass
class Estimate:
    bytes: float
    time: float
    note: str = ""


def estimate(s: Sparsity, ranks: int, hosts: int, link: Link, compute: float, schedule: bool = True,
             local_aggregation: bool = False) -> dict[str, Estimate]:
    """Predicted host-link bytes and seconds per step of each option for one table."""
    n, h = ranks, hosts
    per_host = n // h
    dense, row = s.dim * s.elem, s.dim * (s.wire or s.elem)  # a dense gradient row; a row or row gradient crossing
    out: dict[str, Estimate] = {}

    def t(nbytes, rounds, elems):
        return nbytes / link.rate + rounds * link.latency + elems * link.per_elem

    b = per_host * 2 * (n - 1) / n * s.rows * dense
    out["dense"] = Estimate(b, t(b, 1, s.rows * s.dim))
    b = per_host * (n - 1) * s.k * (row + ID_BYTES)
    out["allgather"] = Estimate(b, t(b, 3, min(s.rows, n * s.k) * s.dim))
    if local_aggregation and per_host > 1:
        b = (h - 1) / h * s.u_host * (2 * row + 2 * ID_BYTES)
    else:
        b = per_host * (n - 1) / n * s.k * (2 * row + 2 * ID_BYTES)
    out["ps"] = Estimate(b, t(b, 6, s.u * s.dim / n))
    for split in ("column", "row"):
        if split == "column" and s.dim < n:
            continue  # a rank would hold no column
        ids = per_host * (n - 1) * s.k * ID_BYTES if split == "column" else per_host * (n - 1) / n * s.k * ID_BYTES
        ids, asks = (0.0, 0) if s.follows else (ids, 2)  # the id exchange: its bytes and its two collectives
        fwd = bwd = per_host * (n - 1) / n * s.k * row
        total = ids + fwd + bwd
        upd = s.u * s.dim / n * link.per_elem
        if not schedule or n == 1:
            out[f"alltoall/{split}"] = Estimate(total, t(total, 2 + asks, s.u * s.dim / n))
            continue
        if s.fed and split == "column":
            # next batch's ids (2 blocking collectives) and its late rows are on the critical path
            critical = s.late * fwd / link.rate + 3 * link.latency
            rest = (ids + (1 - s.late) * fwd + bwd) / link.rate
            hide = compute
            note = f"late rows {s.late:.0%}"
        else:
            critical = (ids + fwd) / link.rate + (1 + asks) * link.latency
            rest = bwd / link.rate + link.latency
            hide = compute * 2 / 3  # the backward pass
            note = "gradients behind backward"
        out[f"alltoall/{split}"] = Estimate(total, critical + max(0.0, rest - hide) + upd, note)
    return out


def choose(est: dict[str, Estimate], allowed: tuple[str, ...]) -> str:
    """The cheapest allowed option (ties go to the earlier, simpler one)."""
    return min((o for o in est if o.split("/")[0] in allowed), key=lambda o: est[o].time)


def env_link_mbit() -> float:
    """TESSEL_LINK_MBIT in Mbit/s, 0 when unset; preflight calls it too, so a bad value stops the job in one line
    before any worker starts (and, under plain torchrun, in the workers)."""
    text = os.environ.get("TESSEL_LINK_MBIT", "")
    if not text:
        return 0.0
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"TESSEL_LINK_MBIT is '{text}'; it must be a positive finite number of Mbit/s, e.g. 200, "
                          "or unset (the rate is then measured)")
    return rate


def probe(group, rate_mbit: float, dtype=torch.float32, dim: int = 64) -> Link:
    """Latency per collective, link rate and row-update cost, measured on ``group`` (the same on every rank).

    ``rate_mbit`` > 0 is taken as the link rate; 0 reads TESSEL_LINK_MBIT (``tessel cluster run`` sets it),
    else times a 1 MiB all_to_all.
    """
    n, dev = dist.get_world_size(group), comm.device(group)
    # a GPU collective returns once queued: the clock reads after the device is done
    done = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    one = torch.zeros(1, device=dev)
    lat = []
    for _ in range(5):
        t0 = time.perf_counter()
        comm.all_reduce(one, "sparse.plan", group=group)
        done()
        lat.append(time.perf_counter() - t0)
    latency = statistics.median(lat)
    source = "given"
    if rate_mbit <= 0 and (from_env := env_link_mbit()) > 0:
        rate_mbit, source = from_env, "TESSEL_LINK_MBIT"
    if rate_mbit > 0:
        rate = rate_mbit * 1e6 / 8
    else:
        source = "measured"
        block = torch.zeros(n * (2**18 // n), device=dev)  # 1 MiB of fp32 per rank
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            comm.all_to_all(torch.empty_like(block), block, "sparse.plan", group=group)
            done()
            times.append(time.perf_counter() - t0)
        rate = (n - 1) / n * block.numel() * 4 / max(min(times) - latency, 1e-6)
    table = torch.zeros(4096, dim, dtype=dtype, device=dev)
    opt = RowOptimizer("adagrad", 0.1)
    state = opt.init(table)
    rows, grads = torch.arange(0, 4096, 2, device=dev), torch.ones(2048, dim, dtype=dtype, device=dev)
    t0 = time.perf_counter()
    for _ in range(3):
        opt.update(table, state, rows, grads)
    done()
    per_elem = (time.perf_counter() - t0) / (3 * grads.numel())
    mine = torch.tensor([latency, rate, per_elem], dtype=torch.float64)
    # Every rank must choose alike: the slowest link, latency and update decide for all.
    worst = torch.stack(comm.all_gather(mine, "sparse.plan", group))
    return Link(rate=float(worst[:, 1].min()), latency=float(worst[:, 0].max()), per_elem=float(worst[:, 2].max()),
                source=source)


def format_plan(est: dict[str, Estimate], chosen: str) -> str:
    cells = "  ".join(f"{'*' if o == chosen else ' '}{o} {e.bytes / 2**20:.2f} MiB {e.time * 1e3:.1f} ms"
                      for o, e in est.items())
    return f"{'':<19}predicted per step: {cells}"
