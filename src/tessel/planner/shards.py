"""One rank's view of a model under a tensor-parallel grid, as the planner's profile holds it: what it holds of
each layer's parameters and output (taken on a meta-device model) and what its layers cost on stand-in groups."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..pipeline.layers import stage_params


@dataclass
class TensorLayer:
    """One rank's chain layer under tensor parallelism, measured on stand-in groups: its activation memory and,
    where timed, its forward and backward seconds, each as a line in the micro-batch's samples (gathered weight
    blocks a layer keeps do not grow with the micro-batch, nor does a small GEMM's set-up)."""

    saved: tuple[float, float]  # (bytes fixed, per sample) its forward keeps for its backward
    work: tuple[float, float]  # (bytes fixed, per sample) its backward holds at once beyond those
    ahead: tuple[float, float] = (0.0, 0.0)  # (bytes fixed, per sample) its forward holds at once beyond them
    time: tuple[float, float] = (0.0, 0.0)  # (seconds fixed, per sample) of its forward and backward (0: untimed)

    def at(self, samples: float) -> tuple[float, float, float]:
        """(Saved, the backward's transients, the forward's) at ``samples`` a micro-batch."""
        return tuple(a + b * samples for a, b in (self.saved, self.work, self.ahead))

    def seconds(self, samples: float) -> float:
        return max(self.time[0] + self.time[1] * samples, 0.0)


@dataclass
class TensorShards:
    """One rank's view of the model under one tensor-parallel grid, per chain layer."""

    sizes: dict[str, int]  # grid axis -> ranks
    each: list[list] = field(default_factory=list)  # [(name, elements)] of the parameters held (profile.param_sizes)
    share: list[float] = field(default_factory=list)  # share of the layer's output held
    partial: list[dict] = field(default_factory=list)  # row-cut axes -> elements whose gradients are summed there
    traffic: list[list] = field(default_factory=list)  # (tokens) -> [(channel, axis, elements, steps, calls)]: norms,
    #                                                    token table, loss (tensor.cost)
    table_parts: dict[str, int] = field(default_factory=dict)  # table -> blocks its rows are cut into (1: whole)


def each_param(model, chain, layers: int) -> list[list[tuple[str, int]]]:
    """Per chain layer, (name, elements) of each parameter it uses, a tied one under the name its first layer
    gives it, so a stage or the whole model can count it once."""
    first: dict[int, str] = {}
    return [[(first.setdefault(id(p), n), p.numel()) for n, p in stage_params(model, chain, i, i + 1).items()]
            for i in range(layers)]


def first_use(layers: list[list[tuple[str, int]]]) -> list[list[tuple[str, int]]]:
    """``layers`` (each_param's lists, for a stage or the whole model) with each parameter under the first layer
    that uses it only: what one rank holds, a tied weight once."""
    seen: set[str] = set()
    out = []
    for named in layers:
        out.append([(name, n) for name, n in named if name not in seen])
        seen.update(name for name, _ in named)
    return out
