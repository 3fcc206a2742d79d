"""What tessel must know about a model class to parallelize it, registered once per class.

torchtitan registers a ``TrainSpec`` per model; tessel registers a :class:`ModelSpec`: ``chain`` (the
model -> its :class:`tessel.chain.Chain`, for pipeline stages and tensor parallelism) and ``tensor``
(applies tensor-parallel layers in place to the submodules a stage holds and returns the chain that runs
them). The reference models are registered by :mod:`tessel.pipeline.layers` and :mod:`tessel.tensor.model`;
a user registers their own the same way::

    tessel.register_model(MyNet, chain=lambda m: Chain([...], F.cross_entropy))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    chain: Callable | None = None  # (model) -> Chain
    tensor: Callable | None = None  # (root, chain, grid, plan, regather) -> Chain of the tensor-parallel layers
    # (model) -> per chain layer, the tensor-parallel linears it runs: (features in, out, up, channel, ends): the
    # planner prices their traffic with tessel.tensor.cost.linear_traffic; ``ends``: nothing after the linear in
    # its layer saves a tensor for backward, so a recompute (torch's stops once the last saved tensor is back)
    # does not run its output's sum again
    linears: Callable | None = None
    # (model, mesh, sequence_parallel) -> the model under torch's own parallelize_module (the peer, tensor mode
    # torch-1d); mesh None: only check that the model can take it
    torch_tensor: Callable | None = None
    # (model, name, tensor, seed) -> fills ``tensor`` with parameter ``name``'s initial value, exactly as the model
    # built whole under torch.manual_seed(seed) holds it: what lets a sharded run build the model on the meta
    # device and make only its own shards (tessel.materialize)
    init: Callable | None = None


_SPECS: dict[type, ModelSpec] = {}

# the package a model class comes from -> the tessel module that registers that package's families (imported the
# first time a model of it is asked about, so the package stays an optional extra)
PROVIDERS = {"transformers": "tessel.hf"}
_LOADED: set[str] = set()


def register_model(cls: type, *, chain: Callable | None = None, tensor: Callable | None = None,
                   linears: Callable | None = None, torch_tensor: Callable | None = None,
                   init: Callable | None = None) -> None:
    """Register (or extend) what tessel knows about ``cls``; given fields replace earlier ones."""
    spec = _SPECS.get(cls, ModelSpec())
    given = (("chain", chain), ("tensor", tensor), ("linears", linears), ("torch_tensor", torch_tensor),
             ("init", init))
    _SPECS[cls] = replace(spec, **{k: v for k, v in given if v is not None})


def spec_of(model: nn.Module) -> ModelSpec:
    """The spec registered for ``model``'s class or its nearest registered base class (empty if none)."""
    for cls in type(model).__mro__:
        if cls in _SPECS:
            return _SPECS[cls]
    provider = PROVIDERS.get(type(model).__module__.split(".")[0])
    if provider is not None and provider not in _LOADED:
        _LOADED.add(provider)
        importlib.import_module(provider)
        return spec_of(model)
    return ModelSpec()


def registered() -> list[str]:
    return sorted(cls.__name__ for cls in _SPECS)
