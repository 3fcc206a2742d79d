"""Parallel degrees and the one DeviceMesh every process group comes from.

``ParallelDims`` checks that dp × pp × tp equals the world before anything is launched; ``build_mesh``
makes the torch ``DeviceMesh`` with named dims ("pp", "dp", "tp", outermost first, the order torchtitan
uses so that tp groups are the closest ranks), and the groups sparse tables use over a dp group's ranks
(per-host groups for local aggregation, a side group for alltoall). No other module creates a process group.
``init_distributed`` joins the world and ``shutdown`` leaves it.

Example (inside a torchrun worker)::

    dims = ParallelDims(dp=2, pp=1, tp=1, world_size=2)
    mesh = build_mesh(dims, timeout=30)
    dp_group = mesh.get_group("dp")
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from . import comm
from .errors import PlanError

DIM_NAMES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of the three axes; their product must be the world size."""

    dp: int
    pp: int
    tp: int
    world_size: int

    def __post_init__(self) -> None:
        for name in DIM_NAMES:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"parallel degree {name}={value} is invalid; degrees are integers >= 1")
        if self.dp * self.pp * self.tp != self.world_size:
            raise PlanError(
                f"parallel degrees dp={self.dp} x pp={self.pp} x tp={self.tp} = "
                f"{self.dp * self.pp * self.tp} do not match the world size {self.world_size}; "
                f"choose degrees whose product is {self.world_size}"
                + (f" (e.g. dp={self.world_size // (self.pp * self.tp)})"
                   if self.world_size % (self.pp * self.tp) == 0 else "")
            )

    @classmethod
    def resolve(cls, world_size: int, dp: int = 0, pp: int = 1, tp: int = 1) -> ParallelDims:
        """Fill in dp=0 as 'what the world leaves after pp and tp' (tp=0: tp takes what pp and dp leave,
        dp defaulting to 1), then validate."""
        if tp == 0:
            dp = dp or 1
            if world_size % (pp * dp):
                raise PlanError(f"world size {world_size} is not divisible by pp={pp} x dp={dp}; "
                                f"choose pp and dp whose product divides {world_size}")
            tp = world_size // (pp * dp)
        if dp == 0:
            if world_size % (pp * tp):
                raise PlanError(f"world size {world_size} is not divisible by pp={pp} x tp={tp}; "
                                f"choose pp and tp whose product divides {world_size}")
            dp = world_size // (pp * tp)
        return cls(dp=dp, pp=pp, tp=tp, world_size=world_size)

    def __str__(self) -> str:
        return f"dp={self.dp} pp={self.pp} tp={self.tp} (world {self.world_size})"

    def strides(self) -> dict[str, tuple[int, int]]:
        """mesh dim -> (size, stride between neighbouring ranks of its groups): the mesh is (pp, dp, tp), pp
        outermost, so tp's ranks are consecutive and a pp group's are dp x tp apart.

        >>> ParallelDims(dp=2, pp=2, tp=2, world_size=8).strides()
        {'pp': (2, 4), 'dp': (2, 2), 'tp': (2, 1)}
        """
        return {"pp": (self.pp, self.dp * self.tp), "dp": (self.dp, self.tp), "tp": (self.tp, 1)}

    def rank(self, pp: int, dp: int, tp: int) -> int:
        """The global rank at mesh coordinate (pp, dp, tp)."""
        s = self.strides()
        return pp * s["pp"][1] + dp * s["dp"][1] + tp


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device_type(device: str = "auto") -> str:
    """Where this rank's model and batches live: ``device`` (auto: the GPU under nccl, else the CPU)."""
    if device != "auto":
        return device
    return "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"


def init_distributed(backend: str = "auto", timeout: float = 30.0, device: str = "auto") -> None:
    """Join the world described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    if dist.is_initialized():
        return
    backend = default_backend() if backend == "auto" else backend
    if backend == "nccl" or device == "cuda":  # under gloo, more local ranks than GPUs share them
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torch's elastic agent keeps one TCPStore across restarts and the last attempt's addresses are still in
        # it, so a restarted group connects to dead peers (pytorch/pytorch#135712); keys under this attempt's
        # prefix are fresh. tessel's launcher sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which avoids it too.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=timeout))
        dist.init_process_group(backend=backend, store=dist.PrefixStore(f"tessel-attempt-{restart}", store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=timeout))
        return
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout))


def shutdown() -> None:
    """Leave the world: every rank waits for the others, then every group is destroyed. Returns at once in a
    process that never joined one, so a script that also runs alone can end with it.

    Call it once the model and optimizer are gone (return from the function that held them): DDP's reducer
    sits in a reference cycle, so the group it holds outlives ``destroy_process_group`` until the cycle is
    collected, and a gloo group still alive when the interpreter exits can abort the process ("terminate
    called without an active exception"; 2 to 7 of 40 two-rank runs of a plain torch DDP loop, torch 2.13).
    """
    if not dist.is_initialized():
        return
    gc.collect()  # the reference cycles of DDP modules the caller has let go, and with them their groups
    comm.barrier()
    dist.destroy_process_group()


def build_mesh(dims: ParallelDims, timeout: float = 30.0,
               tp_axes: tuple[tuple[str, int], ...] = (), device: str = "auto") -> DeviceMesh:
    """The DeviceMesh of shape (pp, dp, tp); every dim's group gets the same collective timeout.

    ``tp_axes``: a 2-D or 3-D tensor-parallel grid, as (name, size) pairs whose sizes multiply to tp; the
    tp dim is then split into these dims (outermost first) instead of one "tp" dim.

    ``new_group`` (which DeviceMesh calls) falls back to a 30-minute default rather than the world's
    timeout, which would turn a dead peer into a half-hour hang; so each group's timeout is set here.
    """
    if dist.get_world_size() != dims.world_size:
        raise PlanError(f"the plan is for {dims.world_size} ranks but the job has {dist.get_world_size()}")
    tp_axes = tuple(tp_axes) or (("tp", dims.tp),)
    if math.prod(size for _, size in tp_axes) != dims.tp:
        raise PlanError(f"tensor-parallel grid {'x'.join(str(s) for _, s in tp_axes)} does not have tp={dims.tp} "
                        "ranks; choose a grid whose sizes multiply to tp")
    names = (*DIM_NAMES[:2], *(name for name, _ in tp_axes))
    shape = (dims.pp, dims.dp, *(size for _, size in tp_axes))
    mesh = init_device_mesh(device_type(device), shape, mesh_dim_names=names)
    for name in names:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout), mesh.get_group(name))
    return mesh


# -- groups over a dp group's ranks for the sparse tables ------------------------------------------------

def host_groups(group, hosts: int | None = None, timeout: float = 30.0):
    """(local group, host group) for local aggregation, or None where each rank is its own host.

    ``hosts``: how many hosts the ranks of ``group`` fill, in order (ranks 0..L-1 on the first). None
    reads torchrun's node rank (GROUP_RANK) from every rank and uses it if the layout is that regular.
    """
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    p = len(ranks)
    if hosts is None:
        mine = torch.tensor([int(os.environ.get("GROUP_RANK", "-1"))], device=comm.device(group))
        nodes = [int(n) for n in comm.all_gather(mine, "sparse.plan", group)]
        count = len(set(nodes))
        regular = min(nodes) >= 0 and nodes == sorted(nodes) and all(nodes.count(n) == p // count for n in nodes)
        hosts = count if regular else p
    if p % hosts:
        raise PlanError(f"{p} ranks do not fill {hosts} hosts evenly; give a host count that divides {p}")
    if hosts in (1, p):  # one host (nothing crosses a host link) or one rank per host (nothing to aggregate)
        subgroups([], timeout)  # still take part: other dp groups may be making theirs
        return None
    grid = torch.tensor(ranks).reshape(hosts, p // hosts)
    local = next(row.tolist() for row in grid if dist.get_rank() in row.tolist())
    host = next(col.tolist() for col in grid.t() if dist.get_rank() in col.tolist())
    return tuple(subgroups([local, host], timeout))


def subgroups(mine: list[list[int]], timeout: float) -> list:
    """New groups over the rank lists ``mine``; every rank of the world must call it (torch's ``new_group``
    is collective over the world), each with its own lists: those of all ranks are created in one order."""
    layouts = comm.all_gather_object(mine, "sparse.plan")
    made = {}
    for ranks in sorted({tuple(r) for lists in layouts for r in lists}):
        made[ranks] = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout))
    return [made[tuple(r)] for r in mine]


def sharding(mesh: DeviceMesh, dp_shard: int, timeout: float) -> tuple[DeviceMesh, object]:
    """(the 1-D mesh of the dp ranks this rank shards its weights with, the group of the dp ranks holding the same
    shards or None): dp_shard consecutive dp ranks share out each weight, and the dp / dp_shard such groups are
    replicas (HSDP; the order torchtitan uses, replicas outermost). Collective over the world where dp_shard < dp.

    Groups of 2 consecutive ranks in a dp group of 4 (0, 1, 2, 3): shards over (0, 1) and (2, 3), the same shard
    held by (0, 2) and by (1, 3).
    """
    dp = mesh["dp"]
    if dp_shard == dp.size():
        return dp, None
    ranks = dist.get_process_group_ranks(mesh.get_group("dp"))
    grid = torch.tensor(ranks).reshape(-1, dp_shard)  # one row per replica
    shard = next(row.tolist() for row in grid if dist.get_rank() in row.tolist())
    same = next(col.tolist() for col in grid.t() if dist.get_rank() in col.tolist())
    shard_group, replicate_group = subgroups([shard, same], timeout)
    return DeviceMesh.from_group(shard_group, mesh.device_type), replicate_group


def side_group(group, timeout: float):
    """A second group over the ranks of ``group`` so sparse traffic never queues behind DDP's all-reduce
    (collective over the world, see :func:`subgroups`)."""
    mine = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    return subgroups([mine], timeout)[0]
