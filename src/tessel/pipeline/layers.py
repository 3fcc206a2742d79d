"""Cutting a model's layer chain (:mod:`tessel.chain`) down to one pipeline stage.

A stage drops every submodule its layers do not use and keeps the model's own parameter names
(checkpoints stay loadable by a single process).

Example::

    >>> from tessel.models import DenseClassifier
    >>> chain = chain_of(DenseClassifier(in_features=8, hidden=16, layers=2, classes=4))
    >>> [layer.name for layer in chain.layers]
    ['net.0', 'net.2', 'net.4']
"""

from __future__ import annotations

from torch import nn

from ..chain import Chain, Layer, chain_of
from ..errors import PlanError

__all__ = ["Chain", "Layer", "chain_of", "prune", "stage_params", "ties"]


def stage_params(model: nn.Module, chain: Chain, lo: int, hi: int) -> dict[str, nn.Parameter]:
    """The parameters layers ``lo..hi-1`` use, by their names in ``model``."""
    out: dict[str, nn.Parameter] = {}
    for layer in chain.layers[lo:hi]:
        for path in layer.owns:
            for name, p in model.get_submodule(path).named_parameters():
                out[f"{path}.{name}"] = p
    return out


def ties(model: nn.Module, chain: Chain, bounds) -> list[dict[int, str]]:
    """The parameters a split puts on more than one stage (a token table tied to the head): for each, stage ->
    its name there. Each stage keeps its own copy; their gradients are summed between those stages before every
    update (Megatron's way), so the copies stay one weight."""
    seen: dict[int, dict[int, str]] = {}
    for s, (lo, hi) in enumerate(bounds):
        for name, p in stage_params(model, chain, lo, hi).items():
            seen.setdefault(id(p), {}).setdefault(s, name)
    return [stages for stages in seen.values() if len(stages) > 1]


def check_ties(found: list[dict[int, str]], why_not: str | None) -> None:
    """PlanError naming the first tied weight if the schedule or layout cannot keep tied copies one weight."""
    if found and why_not:
        stages = found[0]
        raise PlanError(f"parameter '{next(iter(stages.values()))}' is used by stages "
                        f"{' and '.join(map(str, stages))} (a tied weight), which {why_not}; untie it or keep its "
                        "layers on one stage")


def prune(model: nn.Module, chain: Chain, lo: int, hi: int, *more: tuple[int, int]) -> nn.Module:
    """``model`` with every submodule that layers ``lo..hi-1`` (and the ``more`` ranges: a rank that runs
    several stages) do not use replaced by a parameter-free ``nn.Identity``: the stage's parameters keep
    their names, the others are freed."""
    keep = {path for a, b in ((lo, hi), *more) for layer in chain.layers[a:b] for path in layer.owns}
    for layer in chain.layers:
        for path in layer.owns:
            if path not in keep:
                model.set_submodule(path, nn.Identity())
    return model
