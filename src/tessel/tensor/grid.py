"""The tensor-parallel grid: its shape per mode, its axes on the DeviceMesh, and how a tensor is split on it.

Modes and axes (a mesh dim each, outermost first)::

    1d   P          ("tp",)                    Megatron: column / row split
    2d   r x c      ("tp_r", "tp_c")           SUMMA: activations and weights split in 2-D blocks
    3d   x x y x z  ("tp_x", "tp_y", "tp_z")   all-gather / local GEMM / reduce-scatter on a cube or cuboid

A tensor's split is a :class:`Split`: for each tensor dim, the grid axes that cut it, major first. The
same description slices the full tensor (at set-up), names the collectives' groups, and becomes DTensor
placements for checkpoints, so the three can never disagree.

Example::

    spec = GridSpec.parse("3d", 8, "")          # 2x2x2
    spec.axes                                   # (('tp_x', 2), ('tp_y', 2), ('tp_z', 2))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..choices import TensorMode, tensor_mode
from ..errors import PlanError


def _near_equal(n: int, parts: int) -> tuple[int, ...]:
    """n as a product of ``parts`` factors as equal as possible, largest first (8 -> 2,2,2; 4 -> 2,2,1)."""
    if parts == 1:
        return (n,)
    best = None
    for f in range(1, n + 1):
        if n % f == 0:
            rest = _near_equal(n // f, parts - 1)
            cand = tuple(sorted((f, *rest), reverse=True))
            if best is None or max(cand) - min(cand) < max(best) - min(best):
                best = cand
    return best


@dataclass(frozen=True)
class GridSpec:
    mode: TensorMode  # a name resolves to its record
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", tensor_mode(self.mode))
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def axes(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.mode.axes, self.shape))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __str__(self) -> str:
        return f"{self.mode.name} {'x'.join(str(s) for s in self.shape)}"

    @classmethod
    def parse(cls, mode: TensorMode | str, tp: int, grid: str = "") -> GridSpec:
        """The grid for ``tp`` ranks: ``grid`` ("2x2x2", "2x4") if given, else as square / cubic as tp allows."""
        mode = tensor_mode(mode)
        parts = len(mode.axes)
        if not grid:
            return cls(mode, _near_equal(tp, parts))
        try:
            shape = tuple(int(s) for s in grid.lower().split("x"))
        except ValueError:
            shape = ()
        example = "x".join(str(s) for s in _near_equal(tp, parts))
        if len(shape) != parts or min(shape) < 1:
            raise PlanError(f"tensor.grid '{grid}' is invalid for mode {mode.name}: it needs {parts} sizes >= 1 "
                            f"joined by 'x', e.g. '{example}'")
        if math.prod(shape) != tp:
            raise PlanError(f"tensor.grid '{grid}' has {math.prod(shape)} ranks but tp={tp}; "
                            f"choose sizes that multiply to {tp}, e.g. '{example}'")
        return cls(mode, shape)


@dataclass(frozen=True)
class Split:
    """How a tensor is cut: ``dims[d]`` are the grid axes that split tensor dim d, major first."""

    dims: tuple[tuple[int, tuple[str, ...]], ...] = ()

    @classmethod
    def of(cls, **by_dim: tuple[str, ...] | str) -> Split:
        """``Split.of(d0=("tp_y", "tp_z"), d1="tp_x")``: dim 0 cut by y then z, dim 1 by x."""
        out = []
        for key, axes in by_dim.items():
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            if axes:
                out.append((int(key[1:]), axes))
        return cls(tuple(sorted(out)))

    def axes(self) -> set[str]:
        return {a for _, axes in self.dims for a in axes}


class Grid:
    """The grid as one rank sees it: its coordinate and group on every axis (from the mesh, never made here)."""

    def __init__(self, spec: GridSpec, mesh=None, dry: bool = False) -> None:
        """``mesh=None``: the grid as rank 0 sees it, with no groups (to check shapes before workers start), or
        with ``dry`` groups that exist in this process only (:class:`tessel.comm.Dry`: to run its layers)."""
        from ..comm import Dry

        self.spec, self.mesh = spec, mesh
        self.names = tuple(name for name, _ in spec.axes)
        self.sizes = dict(spec.axes)
        self.groups = {n: mesh.get_group(n) if mesh else Dry(self.sizes[n]) if dry else None for n in self.names}
        self.coords = {n: mesh.get_local_rank(n) if mesh else 0 for n in self.names}
        # backward reads the weights as they are then, not as the forward used them (tessel.tensor.ops.matmul):
        # set by the composer for the asynchronous schedules whose backward reads newer weights
        self.live_weights = False

    def __deepcopy__(self, memo) -> Grid:
        # this rank's place on the mesh and its process groups: a copied layer (a pipeline stage's module tree
        # for torch's multi-stage schedules) stands on the same grid, and a process group cannot be copied
        return self

    def size(self, axis: str | None) -> int:
        return self.sizes[axis] if axis else 1

    def group(self, axis: str | None):
        """The axis's process group, or None where the axis has one rank (nothing to communicate)."""
        return self.groups[axis] if axis and self.sizes[axis] > 1 else None

    def block(self, axes: tuple[str, ...]) -> tuple[int, int]:
        """(this rank's block index, number of blocks) of a dim cut by ``axes``, major first."""
        index, count = 0, 1
        for a in axes:
            index, count = index * self.sizes[a] + self.coords[a], count * self.sizes[a]
        return index, count

    def local(self, full: torch.Tensor, split: Split, what: str = "tensor") -> torch.Tensor:
        """This rank's block of ``full`` (a contiguous copy)."""
        out = full
        for d, axes in split.dims:
            index, count = self.block(axes)
            if out.shape[d] % count:
                raise PlanError(f"{what}: dim {d} of size {full.shape[d]} does not split into {count} equal blocks "
                                f"over grid axes {'x'.join(axes)} ({self.spec}); choose sizes divisible by {count}")
            out = out.chunk(count, d)[index]
        # a copy, not a view: a dim-0 block of a contiguous tensor is contiguous already, and as a view it would
        # keep the whole tensor's storage alive on every rank (and sit at an offset inside it)
        return out.clone(memory_format=torch.contiguous_format)

    def whole(self, part: torch.Tensor, split: Split, channel: str = "tp.gather") -> torch.Tensor:
        """The full tensor from every rank's block ``part`` (the inverse of :meth:`local`; a collective over the
        axes that cut it). A dim cut by axes (a, b), major first, is gathered over b, then over a."""
        from .. import comm

        out = part.contiguous()
        for d, axes in reversed(split.dims):
            for a in reversed(axes):
                if self.group(a) is not None:
                    moved = out.movedim(d, 0).contiguous()
                    out = torch.cat(comm.all_gather(moved, channel, self.group(a))).movedim(0, d)
        return out.contiguous()

    def replicas(self, split: Split) -> int:
        """How many ranks of the grid hold the same block (the axes that do not cut the tensor)."""
        used = split.axes()
        return math.prod(s for n, s in self.sizes.items() if n not in used)

    def placements(self, split: Split) -> list:
        """DTensor placements on the grid's mesh dims; an axis cutting a dim is Shard(dim), else Replicate.

        DTensor cuts a dim by its mesh dims in mesh order, so the major-first axes must follow mesh order."""
        from torch.distributed.tensor import Replicate, Shard

        out = [Replicate() for _ in self.names]
        for d, axes in split.dims:
            order = [self.names.index(a) for a in axes]
            if order != sorted(order):
                raise PlanError(f"split of dim {d} by {axes} is not in grid order {self.names}")
            for i in order:
                out[i] = Shard(d)
        return out

    @property
    def submesh(self):
        return self.mesh[self.names]

    def all_reduce_over(self, tensor: torch.Tensor, axes, channel: str = "tp") -> torch.Tensor:
        """Sum ``tensor`` in place over every rank that shares this rank's coordinates off ``axes``."""
        from .. import comm

        for a in axes:
            if self.group(a) is not None:
                comm.all_reduce(tensor, channel, group=self.group(a))
        return tensor
