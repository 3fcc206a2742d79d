"""A model as a straight chain of layers, the unit every parallelism applies to; the module that runs it;
and the reference models' chains (the way torchtitan's ``pipeline_llama`` knows Llama's structure, while
the models themselves know nothing of parallelism).

Each :class:`Layer` maps one activation to the next and names the submodules of the plain model whose
parameters it uses; the :class:`Chain` adds the loss that follows the last layer (no parameters: what
torch's ``PipelineStage`` needs too) and, once tensor parallelism has cut the layers, the shape of this
rank's block of each layer's output. A pipeline stage runs layers ``lo..hi-1``; an unpipelined model runs
them all, with the loss: both are a :class:`Runner`. Which chain a model has is registered per model
class (:mod:`tessel.registry`), never sniffed.

Example::

    >>> import torch
    >>> from torch import nn
    >>> lin = nn.Linear(4, 2)
    >>> chain = Chain([Layer("lin", ("",), lambda r, x: r(x))], nn.functional.cross_entropy)
    >>> loss = Runner(lin, chain)(torch.randn(3, 4), torch.tensor([0, 1, 1]))
    >>> loss.dim()
    0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from .errors import PlanError
from .models import LSTMLM, DenseClassifier, TransformerLM
from .registry import register_model, registered, spec_of


@dataclass(frozen=True)
class Layer:
    name: str
    owns: tuple[str, ...]  # submodule paths of the root model whose parameters this layer uses
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (root model, activation) -> activation


def _whole(layer: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape


@dataclass(frozen=True)
class Chain:
    layers: list[Layer]
    # (last activation, targets) -> mean loss; a loss with parameters (a sampled softmax) is owned by the last layer
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # (layer index, full output shape with the batch dim) -> the shape of this rank's block of it
    local: Callable[[int, tuple[int, ...]], tuple[int, ...]] = field(default=_whole)

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]


# what a selective recompute keeps: the matrix products' outputs (the expensive ops); the rest runs again
_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention")


def _keep_matmuls():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    ops = [getattr(torch.ops.aten, name).default for name in _MATMULS if hasattr(torch.ops.aten, name)]
    return create_selective_checkpoint_contexts(ops)


def _checkpointed(run: Callable, keep_matmuls: bool) -> Callable:
    from torch.utils.checkpoint import checkpoint

    extra = {"context_fn": _keep_matmuls} if keep_matmuls else {}
    # non-reentrant: gradients reach the root's parameters and the layer's input alike; the RNG state is
    # restored for the recompute, so dropout and a sampled softmax's draws repeat exactly
    return lambda root, x: checkpoint(run, root, x, use_reentrant=False, **extra)


def recomputed(chain: Chain, root: nn.Module, keep_matmuls: bool = False) -> Chain:
    """``chain`` whose every layer keeps only its input for backward and runs its forward again there
    (activation checkpointing per layer); ``keep_matmuls`` also keeps its matrix products' outputs, except in a
    recurrent layer (torch's LSTM cell changes its product's output in place, which a kept output must not be)
    and in the last layer (its output, the logits, the loss keeps already), which are recomputed whole."""
    def keeps(layer: Layer) -> bool:
        # the last layer's output is what the loss keeps anyway (a classifier's or an unfused head's logits)
        if not keep_matmuls or layer is chain.layers[-1]:
            return False
        found = dict(root.named_modules())  # a pipeline stage's root holds only its own layers' modules
        owned = [found[path] for path in layer.owns if path in found]
        return not any(isinstance(m, nn.RNNBase) for o in owned for m in o.modules())

    return replace(chain, layers=[replace(layer, run=_checkpointed(layer.run, keeps(layer))) for layer in chain.layers])


class Runner(nn.Module):
    """Layers ``lo..hi-1`` of ``chain`` over the (pruned) model ``root``, whose parameter names it keeps
    under ``root.``; called with targets it also applies the chain's loss."""

    def __init__(self, root: nn.Module, chain: Chain, lo: int = 0, hi: int | None = None) -> None:
        super().__init__()
        self.root, self.chain = root, chain
        self._layers = chain.layers[lo:hi]

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self._layers:
            x = layer.run(self.root, x)
        return x if targets is None else self.chain.loss(x, targets)


# -- the reference models' chains, registered per class -------------------------------------------------

def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def _transformer(m: TransformerLM) -> Chain:
    layers = [Layer("embed", ("tok_emb", "pos_emb", "drop"), lambda r, x: r.embed(x))]
    for i in range(len(m.blocks)):
        layers.append(Layer(f"blocks.{i}", (f"blocks.{i}",), lambda r, x, i=i: r.blocks[i](x)))
    if m.softmax == "sampled" or m.fused_loss:
        # the sampled softmax draws its candidates where the targets are, and the full one's loss runs fused in
        # the head (models.vocab_head): either way on the last stage, whose last layer owns the head (so the
        # stage keeps it) and whose loss runs it on the hidden states (B, T, dim)
        layers.append(Layer("head", ("ln_f", "head"), lambda r, x: r.ln_f(x)))
        return Chain(layers, lambda h, y: m.head(h, y))
    layers.append(Layer("head", ("ln_f", "head"), lambda r, x: r.head(r.ln_f(x))))
    return Chain(layers, _lm_loss)


def _lstm(m: LSTMLM) -> Chain:
    # nn.LSTM runs all its layers in one fused call, so the LSTM is one pipeline layer
    layers = [Layer("embedding", ("embedding",), lambda r, x: r.embedding(x))]
    if m.softmax == "sampled":  # as for the Transformer: the loss is the sampled head, on the last stage
        layers.append(Layer("lstm", ("lstm", "drop", "head"), lambda r, x: r.drop(r.lstm(x)[0])))
        return Chain(layers, lambda h, y: m.head(h, y))
    # the full softmax's loss runs fused in the head (models.vocab_head): the head's layer hands its input on
    layers += [Layer("lstm", ("lstm", "drop"), lambda r, x: r.drop(r.lstm(x)[0])),
               Layer("head", ("head",), lambda r, x: x)]
    return Chain(layers, lambda h, y: m.head(h, y))


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


def _classifier(m: DenseClassifier) -> Chain:
    return Chain(_sequential(m.net, "net."), F.cross_entropy)


register_model(TransformerLM, chain=_transformer, init=TransformerLM.init_parameter)
register_model(LSTMLM, chain=_lstm)
register_model(DenseClassifier, chain=_classifier)


def chain_of(model: nn.Module, loss: Callable | None = None) -> Chain:
    """The registered layer chain of ``model``, or that of an ``nn.Sequential`` with a parameter-free ``loss``."""
    spec = spec_of(model)
    if spec.chain is not None:
        return spec.chain(model)
    if isinstance(model, nn.Sequential):
        if loss is None:
            raise PlanError("an nn.Sequential needs a loss function to be pipelined, e.g. loss=F.cross_entropy")
        return Chain(_sequential(model, ""), loss)
    raise PlanError(f"cannot cut {type(model).__name__} into layers: no chain is registered for it "
                    f"(registered: {', '.join(registered())}); register one with tessel.register_model, "
                    "or use an nn.Sequential")
