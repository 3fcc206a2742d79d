"""A model as a straight chain of layers, the unit pipeline stages are cut from.

The pipeline knows the reference models' structure the way torchtitan's ``pipeline_llama`` knows
Llama's; the models themselves know nothing of pipelines. Each :class:`Layer` maps one activation to
the next and names the submodules whose parameters it uses, so a stage can drop every other
submodule and keep the model's own parameter names (checkpoints stay loadable by a single process).
The loss that follows the last layer has no parameters, which is what torch's ``PipelineStage``
needs too.

Example::

    >>> from tessel.models import DenseClassifier
    >>> chain = chain_of(DenseClassifier(in_features=8, hidden=16, layers=2, classes=4))
    >>> [layer.name for layer in chain.layers]
    ['net.0', 'net.2', 'net.4']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PlanError
from ..models import LSTMLM, DenseClassifier, TransformerLM


@dataclass(frozen=True)
class Layer:
    name: str
    owns: tuple[str, ...]  # submodule paths of the root model whose parameters this layer uses
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (root model, activation) -> activation


@dataclass(frozen=True)
class Chain:
    layers: list[Layer]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (last activation, targets) -> mean loss


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def _no_sampled(model: nn.Module) -> None:
    if getattr(model, "softmax", "full") == "sampled":
        raise PlanError("pipeline parallelism (pp>1) needs model.softmax=full: the sampled softmax draws its "
                        "candidates from the targets inside the output layer; valid: model.softmax=full")


def _transformer(m: TransformerLM) -> Chain:
    _no_sampled(m)
    layers = [Layer("embed", ("tok_emb", "pos_emb", "drop"), lambda r, x: r.embed(x))]
    for i in range(len(m.blocks)):
        layers.append(Layer(f"blocks.{i}", (f"blocks.{i}",), lambda r, x, i=i: r.blocks[i](x)))
    layers.append(Layer("head", ("ln_f", "head"), lambda r, x: r.head(r.ln_f(x))))
    return Chain(layers, _lm_loss)


def _lstm(m: LSTMLM) -> Chain:
    _no_sampled(m)
    # nn.LSTM runs all its layers in one fused call, so the LSTM is one pipeline layer
    return Chain([Layer("embedding", ("embedding",), lambda r, x: r.embedding(x)),
                  Layer("lstm", ("lstm", "drop"), lambda r, x: r.drop(r.lstm(x)[0])),
                  Layer("head", ("head",), lambda r, x: r.head(x))], _lm_loss)


def _sequential(seq: nn.Sequential, prefix: str) -> list[Layer]:
    """One layer per module with parameters, the parameter-free modules after it (ReLU, Dropout) folded in."""
    groups: list[list[int]] = []
    for i, mod in enumerate(seq):
        if not groups or any(True for _ in mod.parameters()):
            groups.append([i])
        else:
            groups[-1].append(i)
    layers = []
    for idx in groups:
        owns = tuple(f"{prefix}{i}" for i in idx)

        def run(r, x, owns=owns):
            for path in owns:
                x = r.get_submodule(path)(x)
            return x

        layers.append(Layer(owns[0], owns, run))
    return layers


def chain_of(model: nn.Module, loss: Callable | None = None) -> Chain:
    """The layer chain of a reference model, or of an ``nn.Sequential`` with a parameter-free ``loss``."""
    if isinstance(model, TransformerLM):
        return _transformer(model)
    if isinstance(model, LSTMLM):
        return _lstm(model)
    if isinstance(model, DenseClassifier):
        return Chain(_sequential(model.net, "net."), F.cross_entropy)
    if isinstance(model, nn.Sequential):
        if loss is None:
            raise PlanError("an nn.Sequential needs a loss function to be pipelined, e.g. loss=F.cross_entropy")
        return Chain(_sequential(model, ""), loss)
    raise PlanError(f"cannot cut {type(model).__name__} into pipeline stages; valid: TransformerLM, LSTMLM, "
                    "DenseClassifier or an nn.Sequential")


def stage_params(model: nn.Module, chain: Chain, lo: int, hi: int) -> dict[str, nn.Parameter]:
    """The parameters layers ``lo..hi-1`` use, by their names in ``model``."""
    out: dict[str, nn.Parameter] = {}
    for layer in chain.layers[lo:hi]:
        for path in layer.owns:
            for name, p in model.get_submodule(path).named_parameters():
                out[f"{path}.{name}"] = p
    return out


def check_no_shared(model: nn.Module, chain: Chain, bounds: list[tuple[int, int]]) -> None:
    """Refuse a split that puts one parameter (a tied embedding) on two stages."""
    seen: dict[int, int] = {}
    for s, (lo, hi) in enumerate(bounds):
        for name, p in stage_params(model, chain, lo, hi).items():
            if seen.setdefault(id(p), s) != s:
                raise PlanError(f"parameter '{name}' is used by stages {seen[id(p)]} and {s} (a tied weight); "
                                "untie it (model.tie_embeddings=false) or keep its layers on one stage")


def prune(model: nn.Module, chain: Chain, lo: int, hi: int) -> nn.Module:
    """``model`` with every submodule that layers ``lo..hi-1`` do not use replaced by a parameter-free
    ``nn.Identity``: the stage's parameters keep their names, the others are freed."""
    keep = {path for layer in chain.layers[lo:hi] for path in layer.owns}
    for layer in chain.layers:
        for path in layer.owns:
            if path not in keep:
                model.set_submodule(path, nn.Identity())
    return model
