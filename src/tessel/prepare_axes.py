"""``tessel.prepare`` under a :class:`~tessel.plan.ParallelPlan`: pipeline and tensor parallelism in a user's loop.

A pipeline interleaves the forwards and backwards of micro-batches across stages, and tensor parallelism
sums partial gradients over its grid before the update, so with pp or tp in the plan the returned model
runs the whole step. In a script started by ``tessel run --nproc 4 script.py``::

    plan = tessel.ParallelPlan(dp=2, pp=2, micro_batches=2)
    model, optimizer, loader = tessel.prepare(model, optimizer, loader, plan=plan)
    for x, y in loader:
        loss = model.step(x, y)      # forwards, backwards, gradient sync, clipping, update: the global mean loss
        scheduler.step()             # the optimizer's LR when model.step is called is that step's

The model's class is registered (``tessel.register_model(cls, chain=..., tensor=...)``: the chain cuts it
into stages, the tensor function makes a stage's layers tensor-parallel) and ``model(x, y)`` is its mean
loss. The plan goes through the composer, :func:`tessel.parallelize.parallelize`, exactly as ``tessel train``
applies it; each rank's share of the weights gets the user's optimizer (same class and settings), the
tables are served over each stage's dp group (the plan's ``tables``, else ``auto``) by the row optimizer
mirroring it, and ``max_norm`` clips by the norm over every stage, shard and row.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import comm, pipeline, sparse
from .chain import chain_of
from .choices import Optimizer
from .data.prepared import PreparedLoader
from .errors import TesselError
from .mesh import build_mesh
from .parallelize import parallelize
from .plan import ParallelPlan
from .registry import registered, spec_of
from .settings import DTYPES, Settings
from .sparse.rowopt import auto_mirror, record_of
from .train.memory import release_free
from .train.optim import without_fused_on_shards
from .unwrap import skeleton

KEEP_LRS = 64


class SteppedModel(nn.Module):
    """This rank's share of the model under pp/tp; ``step(x, y)`` trains one global batch's slice."""

    def __init__(self, par, mesh, loader: PreparedLoader, lr_groups: list[dict], identity: dict,
                 inputs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.par, self.mesh, self.loader, self.lr_groups, self.identity = par, mesh, loader, lr_groups, identity
        self.inputs_shape = inputs_shape  # a rank's slice of the inputs, as profiled
        self.module = par.module  # registered, so .parameters() and .state_dict() are this rank's share
        self.tables = par.tables
        self.steps = 0  # steps taken by this object (the engine's step index)
        # the optimizer's LR at each step's call (a scheduler's): that mini-batch's, also when an asynchronous
        # pipeline applies its update a step later or predicts across it; only the last KEEP_LRS steps are
        # kept (an update lags at most pp steps), so a long run does not grow it
        self.lrs: dict[int, float] = {}
        par.engine.lr_of = lambda step: self.lrs[min(step, max(self.lrs))]

    def forward(self, *args, **kwargs):
        raise TesselError("under pipeline or tensor parallelism the step is one call: loss = model.step(x, y) "
                          "runs the forwards, backwards and update (no model(...), backward or optimizer.step); "
                          "loss = model.evaluate(x, y) runs the forwards alone")

    def step(self, x, y: torch.Tensor | None = None) -> torch.Tensor:
        """One training step on this rank's slice, ``step(x, y)`` or ``step(batch)`` with a dict batch (its
        ``input_ids`` and ``labels``); returns the global batch's mean loss on every rank."""
        x, y = pair(x if y is None else (x, y))
        engine = self.par.engine
        self.lrs[self.steps] = float(self.lr_groups[0]["lr"])
        self.lrs.pop(self.steps - KEEP_LRS, None)
        # scheduled tables fetch the next batch's rows for its inputs (a user's batch need not pair up ahead of time)
        ahead = (self.loader.next_inputs,) if x is self.loader.current and self.loader.next_inputs is not None else None
        result = engine.step(x, y, self.steps, ahead if self.tables and self.tables.choices else None).read()
        self.steps += 1
        release_free(self.steps)  # malloc's free holes back to the system (train/memory.py)
        return self._global(result.loss)

    def evaluate(self, x, y: torch.Tensor | None = None) -> torch.Tensor:
        """The mean loss of a batch's slice (as ``step`` takes it; ``loader.sliced(...)`` slices a held-out
        loader) under the weights as they are: forwards only, in eval mode, no gradient, nothing updated. Returns
        the global batch's mean on every rank. An asynchronous schedule first applies the updates still in flight
        (as ``tessel.save`` does; the next step fills the pipeline again)."""
        x, y = pair(x if y is None else (x, y))
        if self.par.plan.pp > 1 and tuple(x.shape) != self.inputs_shape:
            # every rank is handed the batch, so all refuse it together (a stage's sends and receives are sized
            # by the profiled shape: a first stage alone refusing would leave the next one waiting)
            raise TesselError(f"model.evaluate got inputs of shape {tuple(x.shape)}; under a pipeline every batch has "
                              f"the training slice's shape {self.inputs_shape} (pad or drop a short last batch)")
        self.drain()
        return self._global(float(self.par.engine.evaluate(x, y)))

    def _global(self, mine: float) -> torch.Tensor:
        """The global batch's mean loss on every rank from this rank's slice mean (0 off the last stage)."""
        loss = torch.tensor([mine], dtype=torch.float64, device=comm.device())
        comm.all_reduce(loss, "meta", group=self.mesh.get_group("dp"))  # each dp rank's slice mean -> their sum
        if self.par.plan.pp > 1:  # only the last stage has a loss (the others' is 0)
            # under an asynchronous schedule this re-aligns the stages once a step, which tessel train avoids by
            # logging on the last stage only; a loop that wants every rank to get its loss pays for it here
            comm.all_reduce(loss, "meta", group=self.mesh.get_group("pp"))
        return loss[0] / self.par.plan.dp

    def drain(self) -> None:
        """Apply every mini-batch still in flight (asynchronous schedules); ``tessel.save`` calls it."""
        self.par.engine.drain(self.steps)

    def checkpoint_parts(self, optimizer) -> dict[str, Any]:
        return {"module": self.par.module, "optimizer": self.par.optimizer, "tables": self.tables or None,
                "tp": self.par.shards, "identity": self.identity, "plan": self.par.plan}


class SteppedOptimizer(torch.optim.Optimizer):
    """The user's optimizer as far as a loop still touches it: its ``param_groups`` carry the LR (schedulers
    attached before or after ``prepare`` work); the state is the rank's own optimizer's, which model.step steps."""

    def __init__(self, user: torch.optim.Optimizer, inner: torch.optim.Optimizer) -> None:
        # No super().__init__: a proxy, as PreparedOptimizer is.
        self.user, self.optimizer = user, inner
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        self._opt_called = True  # torch's LR schedulers warn unless the optimizer stepped: model.step does

    param_groups = property(lambda self: self.user.param_groups)
    state = property(lambda self: self.optimizer.state)
    defaults = property(lambda self: self.user.defaults)

    def step(self, closure=None):
        raise TesselError("under pipeline or tensor parallelism model.step(x, y) already updated the weights; "
                          "drop optimizer.step() from the loop")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: model.step leaves no gradient behind."""

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state) -> None:
        self.optimizer.load_state_dict(state)


def pair(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a batch under pp or tp, where the chain runs the model: a tuple ``(x, y)``, or a dict
    with ``input_ids`` and ``labels`` (Hugging Face's; an ``attention_mask`` only if it masks nothing)."""
    if isinstance(batch, dict):
        missing = [k for k in ("input_ids", "labels") if k not in batch]
        other = sorted(set(batch) - {"input_ids", "labels", "attention_mask"})
        if missing or other:
            raise TesselError(f"a dict batch under pp or tp needs input_ids and labels (and at most attention_mask); "
                              f"this one {'lacks ' + ', '.join(missing) if missing else 'has ' + ', '.join(other)}")
        mask = batch.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise TesselError("a dict batch's attention_mask masks tokens (padding); under pp or tp a stage runs "
                              "causal attention on whole sequences: pack or pad-free batches, or drop pp/tp")
        return batch["input_ids"], batch["labels"]
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(torch.is_tensor(t) for t in batch):
        return batch[0], batch[1]
    kind = f"a {type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    raise TesselError(f"under pp or tp a batch is (inputs, targets) or a dict with input_ids and labels; the loader "
                      f"gave {kind}")


def _constructor(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's one set of constructor settings, to rebuild it over each rank's share of the weights: its
    param group's values for the parameters its class's constructor takes (torch 2.13's AdamW keeps a
    ``decoupled_weight_decay`` in its groups that its constructor does not take)."""
    takes = inspect.signature(type(optimizer).__init__).parameters
    groups = [{k: v for k, v in g.items() if k in takes and k != "params"} for g in optimizer.param_groups]
    if any(g != groups[0] for g in groups):
        raise TesselError(f"{type(optimizer).__name__} has {len(groups)} param groups with different settings; "
                          "under pp or tp each rank's optimizer is rebuilt with one group: give all the same settings")
    return groups[0]


# torch's optimizers whose update of each element reads only that element's gradient and state: rebuilt over a
# tensor-parallel shard they update it as they would the whole tensor (Adafactor's factored moments and Muon's
# orthogonalisation read whole rows, columns or matrices)
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop")


def _rebuilt(cls: type, params, given: dict) -> torch.optim.Optimizer:
    """The user's optimizer class with their settings over a rank's share of the weights."""
    params = [p for p in params if p.requires_grad]
    return cls(params or [{"params": []}], **without_fused_on_shards(given, params))


def _check_rebuilt(cls: type, given: dict, plan: ParallelPlan) -> None:
    """One line unless ``cls`` rebuilt with the user's settings over a rank's share of the weights steps as it
    would over the whole model: without a closure, on a matrix and a vector, and elementwise under tp."""
    closure = inspect.signature(cls.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise TesselError(f"{cls.__name__}.step needs a closure (it evaluates the loss several times a step), "
                          "which model.step cannot give under pp or tp; use another optimizer, e.g. AdamW")
    if plan.tp > 1 and cls.__name__ not in ELEMENTWISE:
        raise TesselError(f"{cls.__name__} updates a weight from its whole tensor, which tensor parallelism holds in "
                          f"shards; under tp use one that updates each element alone: {', '.join(ELEMENTWISE)}")
    params = [nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(2))]
    for p in params:
        p.grad = torch.full_like(p, 0.1)
    try:
        cls(params, **given).step()
    except Exception as e:  # noqa: BLE001 - whatever the class refuses, said in one line
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TesselError(f"{cls.__name__} cannot be rebuilt over a rank's share of the weights and stepped with "
                          f"dense gradients ({why}); use one that steps each parameter alone, e.g. AdamW") from None


def _settings(model: nn.Module, optimizer, given: dict, global_batch: int, max_norm: float,
              timeout: float) -> Settings:
    """The run settings the composer takes, mirroring the user's optimizer (model.step gives the engine each step's
    LR). An optimizer tessel has no record of keeps its class: the plan's checks then refuse what needs a known
    one (async-predict's prediction)."""
    cls = type(optimizer)
    record = record_of(optimizer) or Optimizer(cls.__name__.lower(), cls.__name__, rows="", states=2, direction=False)
    dtype = next(model.parameters()).dtype
    adam = {k: tuple(v) if k == "betas" else v for k, v in given.items() if k in ("betas", "momentum_decay")}
    return Settings(optimizer=record, lr=given["lr"], momentum=given.get("momentum", 0.0), **adam,
                    weight_decay=given.get("weight_decay", 0.0), lr_schedule="constant", warmup=0, clip=max_norm,
                    dtype=next((name for name, d in DTYPES.items() if d == dtype), "float32"),
                    global_batch=global_batch, timeout=timeout)


def _check(model: nn.Module, plan: ParallelPlan, settings: Settings, world: int) -> None:
    """What the plan, the launch and the model allow, each a one-line TesselError, before any collective."""
    if plan.world != world:
        raise TesselError(f"the plan needs dp x pp x tp = {plan.dp} x {plan.pp} x {plan.tp} = {plan.world} ranks and "
                          f"the script runs on {world}; start it with 'tessel run --nproc {plan.world} script.py'")
    peer = plan.schedule if plan.pp > 1 and plan.schedule.torch_peer else plan.tp_mode if plan.tp > 1 else None
    if peer is not None and peer.torch_peer:
        raise TesselError(f"plan {plan.describe()} names torch's own {peer.name}, the peer tessel benchmarks "
                          "against; prepare runs tessel's schedules and tensor modes")
    plan.check(settings)
    if plan.tp > 1 and spec_of(model).tensor is None:
        raise TesselError(f"tp={plan.tp} needs a tensor-parallel plan registered for {type(model).__name__} "
                          f"(tessel.register_model(cls, tensor=...); registered: {', '.join(registered())})")
    chain = chain_of(model)  # PlanError naming how to register one
    if plan.pp > 1:
        pipeline.check_model(chain, plan.pp)
    if plan.tp > 1:
        from . import tensor

        per_rank = settings.global_batch // (plan.dp * plan.micro_batches)
        meta = skeleton(model)
        tensor.check_shapes(meta, chain_of(meta), tensor.GridSpec(plan.tp_mode, plan.tp_grid), per_rank)


def checkpoint_plan(path: str | Path | None) -> ParallelPlan | None:
    """The plan stored with checkpoint ``path`` (or with the newest one in it), if there is one."""
    if path is None:
        return None
    from .train import checkpoint

    found = checkpoint.find(path)
    meta = checkpoint.read_meta(found) if found is not None else {}
    return ParallelPlan.from_dict(meta["plan"]) if "plan" in meta else None


def identity_of(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint of ``model`` must match: its class and every tensor's name and shape."""
    shapes = {n: "x".join(map(str, t.shape)) for n, t in model.state_dict().items()}
    return {"model": {"class": type(model).__name__, **shapes}}


def _resumed(plan: ParallelPlan, resume) -> ParallelPlan:
    """``plan`` with a checkpoint's stage cut and table choices, so its shares load where they were saved."""
    saved = checkpoint_plan(resume)
    if saved is None:
        return plan
    # the cut and the tables are the checkpoint's to give; so is the table policy (dense where nothing is served)
    if saved.with_(bounds=(), tables=(), sparse=plan.sparse) != plan.with_(bounds=(), tables=()):
        raise TesselError(f"the checkpoint in '{resume}' was saved under {saved.describe()} and this run's is "
                          f"{plan.describe()}; resume under the plan it was saved with")
    return plan.with_(bounds=saved.bounds, tables=saved.tables)


def prepare_axes(model: nn.Module, optimizer: torch.optim.Optimizer, loader, plan: ParallelPlan, *, samples: int,
                 lazy: bool, max_norm: float, timeout: float, resume, verbose: bool, precision=None):
    """(SteppedModel, SteppedOptimizer, PreparedLoader); see the module docstring."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    found = sparse.find_tables(model)
    decided = plan.tables and any(t.strategy.served for t in plan.tables)
    serve = plan.dp > 1 and bool(found) and bool(decided if plan.tables else any(
        s.served or s.decides for s in plan.sparse.given()))
    probe = pair(PreparedLoader(loader, 0, 1).samples(1)[0])
    given, cls = _constructor(optimizer), type(optimizer)
    _check_rebuilt(cls, given, plan)
    settings = _settings(model, optimizer, given, probe[0].shape[0], max_norm, timeout)
    settings = settings.with_(precision=precision) if precision is not None else settings
    _check(model, plan, settings, world)
    plan = _resumed(plan, resume)
    if not serve:  # nothing to serve: no row optimizer is needed or built
        plan = plan.with_(sparse=replace(plan.sparse, strategy="dense", overrides=()))
    named = any(t.strategy.served for t in plan.tables) or any(s.served or s.ddp_sparse for s in plan.sparse.given())
    rows = auto_mirror(optimizer, optimizer.param_groups[0], lazy, named,
                       verbose and dist.get_rank() == 0) if serve else None
    if serve and rows is None:  # auto, and no exact row form: every table stays dense
        plan = plan.with_(sparse=replace(plan.sparse, strategy="dense", overrides=()))
    mesh = build_mesh(plan.dims, timeout, plan.mesh_axes, next((p.device.type for p in model.parameters()), "cpu"))
    prepared = PreparedLoader(loader, mesh.get_local_rank("dp"), plan.dp)
    identity = identity_of(model)  # the whole plain model, before a cut or shards change it
    plain = skeleton(model)
    par = parallelize(model, plan, mesh, [pair(b) for b in prepared.samples(samples)], settings, rows=rows,
                      make_optimizer=lambda params: _rebuilt(cls, params, given))
    for group in optimizer.param_groups:  # the weights now live in each rank's own optimizer
        group["params"] = []
    optimizer.state.clear()
    optimizer._opt_called = True  # torch's LR schedulers warn unless it stepped: model.step steps for it
    if verbose and dist.get_rank() == 0:
        print(par.describe(), flush=True)
    stepped = SteppedModel(par, mesh, prepared, optimizer.param_groups, identity,
                           (probe[0].shape[0] // plan.dp, *probe[0].shape[1:]))
    stepped.__dict__["skeleton"] = plain  # what tessel.unwrap fills (not a submodule: its tensors are on meta)
    return stepped, SteppedOptimizer(optimizer, par.optimizer), prepared
