"""``tessel.prepare``: a user's own single-process loop, data-parallel with sparse tables, three lines changed.

In a script started by ``torchrun --nproc-per-node N script.py``::

    model, optimizer, loader = tessel.prepare(model, optimizer, loader)   # plan="auto"
    for x, y in loader:
        loss = model(x, y); loss.backward(); optimizer.step(); optimizer.zero_grad()

``loader`` yields global batches (a tensor or a tuple/list of tensors, batch first; every rank's loader the
same ones in the same order); the returned loader yields this rank's contiguous slice of each, so a mean loss
over the slice, averaged by DDP, is the single-process mean over the global batch. ``prepare`` measures the
model's tables (``nn.Embedding``/``nn.EmbeddingBag``) on the loader's first batches, serves each by ``plan``
(``auto``: the cost model of :mod:`tessel.sparse.cost` per table; a strategy for all; or {table: strategy}),
wraps the rest in DDP, and hides each step's table work in the returned objects:

- ``model(...)``: starts the next batch's rows on their way (scheduled ``alltoall``; the loader is peeked);
- ``optimizer.step()``: row gradients to their owners, rows updated with the optimizer's own LR (schedulers
  work), then the dense step; ``zero_grad`` as usual;
- ``tessel.clip_grad_norm_(model, max_norm)``: torch's rule over dense and row gradients together;
- ``model.no_sync()``: as DDP's, for gradient accumulation (several forwards and backwards a step work with
  every table strategy; inside it the dense gradients wait for the step's last backward).

Rows are updated by a row optimizer mirroring the user's: SGD without momentum and Adagrad equal torch's
dense update exactly (a zero-gradient row does not move); torch's momentum SGD, Adam and AdamW move rows
whose gradient is zero, which only a lazy row update approximates, so they need ``lazy=True``
(:mod:`tessel.sparse.rowopt`). Every rank must run the same forwards (table lookups are collective).
Launched without torchrun (one process), ``prepare`` changes nothing and returns working equivalents.

With a :class:`~tessel.plan.ParallelPlan` holding pp or tp, a registered model is cut into pipeline stages
and made tensor-parallel, and the loop calls ``loss = model.step(x, y)`` instead (:mod:`tessel.prepare_axes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import choices, comm, sparse
from .chain import chain_of
from .choices import TableStrategy
from .data.prepared import PreparedLoader, batch_tensors, call, first_tensor
from .errors import ConfigError, PlanError, TesselError
from .mesh import ParallelDims, build_mesh, init_distributed
from .parallelize import apply_ddp, shard_model
from .plan import ParallelPlan, TableChoice, TablePolicy
from .prepare_axes import checkpoint_plan, identity_of, prepare_axes
from .settings import Settings
from .sparse.rowopt import auto_mirror
from .train.engine import evaluation
from .train.memory import release_free
from .train.optim import without_fused_on_shards
from .train.tail import clip_coef, local_sq
from .unwrap import skeleton

__all__ = ["prepare", "clip_grad_norm_", "save", "load", "PreparedModel", "PreparedOptimizer", "PreparedLoader"]


def _join(timeout: float, model: nn.Module) -> None:
    """Join torchrun's world when launched by it (and not joined yet): over nccl where the model is on a GPU."""
    if not dist.is_initialized() and "WORLD_SIZE" in os.environ:
        on_gpu = any(p.is_cuda for p in model.parameters())
        init_distributed("nccl" if on_gpu else "gloo", timeout=timeout)


def _world(expected: int | None, timeout: float, model: nn.Module):
    """(dp group or None, rank, size): joins torchrun's world when launched by it."""
    _join(timeout, model)
    size = dist.get_world_size() if dist.is_initialized() else 1
    if expected is not None and expected != size:
        raise TesselError(f"prepare expected {expected} ranks but runs on {size}; launch the script with "
                          f"'torchrun --nproc-per-node {expected} script.py' (or drop world=)")
    if size == 1:
        return None, 0, 1, None
    mesh = build_mesh(ParallelDims.resolve(size), timeout=timeout,
                      device=next((p.device.type for p in model.parameters()), "cpu"))
    return mesh.get_group("dp"), dist.get_rank(), size, mesh


def _sharded(model: nn.Module, optimizer: torch.optim.Optimizer, plan: ParallelPlan, mesh, mixed: Settings,
             timeout: float):
    """(``model`` under FSDP2 over groups of plan.dp_shard ranks, the group a rank's shards are among): its
    registered chain's layers each a unit (else its blocks: the items of its outermost ModuleLists and
    Sequentials), then the root; the user's optimizer is given the sharded parameters in place of the whole ones
    (FSDP makes new ones), and any state it holds already (Adagrad's sums) cut as the weights are."""
    from . import fsdp  # torch's FSDP and DTensor take a second to import: only where weights are sharded

    try:
        owned = [layer.owns for layer in chain_of(model).layers]
    except PlanError:  # not registered: the items of its outermost ModuleLists and Sequentials (its blocks)
        owned = []
        for name, m in model.named_modules():
            inside = any(name.startswith(f"{o[0]}.") for o in owned)
            if isinstance(m, (nn.ModuleList, nn.Sequential)) and not inside:
                owned += [(f"{name}.{i}" if name else str(i),) for i in range(len(m))]
    names = {id(p): n for n, p in model.named_parameters()}
    model, group = shard_model(model, owned, plan, dataclasses.replace(mixed, timeout=timeout), mesh)
    now = dict(model.named_parameters())
    for grp in optimizer.param_groups:
        grp["params"] = [now[names[id(p)]] for p in grp["params"]]
        grp.update(without_fused_on_shards(grp, grp["params"]))
    for old in list(optimizer.state):
        new = now[names[id(old)]]
        optimizer.state[new] = {k: fsdp.shard_like(v, new, group) if torch.is_tensor(v) and v.shape == old.shape
                                else v for k, v in optimizer.state.pop(old).items()}
    return model, group


class PreparedModel(nn.Module):
    """The user's model with its tables served and the rest in DDP; call it as before."""

    def __init__(self, module: nn.Module, tables: sparse.SparseTables, loader: PreparedLoader,
                 autocast=contextlib.nullcontext, shards=None) -> None:
        super().__init__()
        self.module, self.tables, self.loader = module, tables, loader
        self.shards = shards  # sharded (FSDP): the group of the ranks a weight's shards are spread over
        self.autocast = autocast  # () -> the context the forward runs in (mixed precision: autocast to bf16)
        self.reduced: torch.Tensor | None = None  # the rows' squared norm once clipping reduced them
        self.scale = 1.0

    def forward(self, *args, **kwargs):
        ids = first_tensor(args if args else kwargs) if args or kwargs else None
        if self.tables and torch.is_grad_enabled() and torch.is_tensor(ids):
            # the next batch's rows start travelling, when this forward takes the batch the loader just gave
            # (the same tensor object: a copy, e.g. moved to a device, just fetches its own rows in time)
            if ids is self.loader.current:
                self.tables.begin_step(batch_tensors(self.loader.batch), batch_tensors(self.loader.upcoming))
            else:
                self.tables.begin_step(ids, None)
        with self.autocast():
            out = self.module(*args, **kwargs)
        if self.tables:
            # each forward's backward completes its rows' gradients (a loop accumulating over forwards: the step
            # reduces every forward's)
            self.tables.final_backward(True)
        return out

    def evaluate(self, *batch) -> torch.Tensor:
        """The global batch's mean loss from this rank's slice, forwards only (eval mode, no gradient): the model's
        own output on ``evaluate(x, y)`` or ``evaluate(batch)`` (a dict as ``model(**batch)``), a scalar loss or an
        output with ``.loss`` (Hugging Face's), averaged over the ranks; the same call as under pp/tp."""
        with evaluation(self, self.tables):
            out = call(self, batch[0]) if len(batch) == 1 else self(*batch)
        loss = getattr(out, "loss", out)
        if not (torch.is_tensor(loss) and loss.numel() == 1):
            raise TesselError("evaluate needs the model to return its loss (a scalar tensor, or an output with "
                              f".loss); it returned {type(out).__name__}")
        mean = loss.detach().to(torch.float64).reshape(1)
        if dist.is_initialized():
            comm.all_reduce(mean, "meta")  # each rank's slice mean -> their sum
            mean /= dist.get_world_size()
        return mean[0]

    @contextlib.contextmanager
    def no_sync(self):
        """As DDP's ``no_sync``: the dense gradients of the forwards and backwards inside stay on this rank, summed
        into the next synchronised backward's (gradient accumulation with one reduction a step); under FSDP the
        unsharded gradients are kept until then. The tables' row gradients still go to their owners per backward."""
        m = self.module
        if hasattr(m, "set_requires_gradient_sync"):  # FSDP2
            m.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                m.set_requires_gradient_sync(True)
        else:
            with m.no_sync() if hasattr(m, "no_sync") else contextlib.nullcontext():  # DDP; one process: as is
                yield

    def drain(self) -> None:
        """Nothing is in flight between the steps of a data-parallel loop."""

    def checkpoint_parts(self, optimizer) -> dict[str, Any]:
        """What a checkpoint holds and must match: the plain model, the user's optimizer, the tables, the plan."""
        picked = self.tables.choices if self.tables else []
        shard = dist.get_world_size(self.shards) if self.shards is not None else 1
        plan = ParallelPlan(dp=self.loader.size, tables=tuple(TableChoice.of(c) for c in picked), dp_shard=shard)
        return {"module": _plain(self), "optimizer": optimizer.optimizer if optimizer is not None else None,
                "tables": self.tables or None, "tp": None, "shards": self.shards,
                "identity": _identity(self), "plan": plan}

    def finish_rows(self) -> torch.Tensor:
        """Row gradients to their owners (once per step); their global squared norm."""
        if self.reduced is None:
            self.reduced = self.tables.reduce() if self.tables else torch.zeros((), dtype=torch.float64)
        return self.reduced


class PreparedOptimizer(torch.optim.Optimizer):
    """The user's optimizer over the dense parameters; ``step`` first updates the served tables' rows."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: PreparedModel, table_group: int) -> None:
        # No super().__init__: this object proxies ``optimizer`` (param_groups, state) so LR schedulers work.
        self.optimizer, self.model, self.table_group = optimizer, model, table_group
        self.steps = 0
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def step(self, closure=None):
        if closure is not None:
            raise TesselError("optimizer.step(closure) is not supported after prepare; call step() after backward")
        m = self.model
        if m.tables:
            m.finish_rows()
            m.tables.step(self.optimizer.param_groups[self.table_group]["lr"], m.scale)
        m.reduced, m.scale = None, 1.0
        self.optimizer.step()
        self.steps += 1
        release_free(self.steps)  # malloc's free holes back to the system (train/memory.py)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state) -> None:
        self.optimizer.load_state_dict(state)


def clip_grad_norm_(model: PreparedModel, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the dense gradients and the served tables' row gradients (all
    ranks' rows: their squared norm comes back summed); call between backward and ``optimizer.step()``."""
    if not isinstance(model, PreparedModel):
        raise TesselError("tessel.clip_grad_norm_ takes the model tessel.prepare returned")
    params = list(model.parameters())
    sq = local_sq(params)
    if model.shards is not None:  # each rank holds a shard of every gradient: the squares summed over them
        comm.all_reduce(sq, "meta", group=model.shards)
    norm = (sq + model.finish_rows()).sqrt().reshape(())  # a scalar, as torch's
    coef = clip_coef(float(norm), max_norm)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
    model.scale = coef
    return norm


def _strategy(name) -> TableStrategy:
    try:
        return choices.table_strategy(name)
    except ConfigError:
        raise TesselError(f"plan '{name}' is unknown; valid: {', '.join(choices.names(TableStrategy))}") from None


def _table_policy(plan, names: list[str], tied: dict[str, list[str]], link_mbit: float = 0.0) -> TablePolicy:
    """How the tables are to be held, from ``plan`` (a strategy for all, {table: strategy}, or a data-parallel
    ParallelPlan's own policy); tied tables refused by name."""
    if isinstance(plan, ParallelPlan):
        policy = plan.sparse
    elif isinstance(plan, str):
        policy = TablePolicy(strategy=_strategy(plan), max_touched=1.0, link_mbit=link_mbit)
    elif isinstance(plan, dict):
        policy = TablePolicy(overrides=tuple((str(k), _strategy(v)) for k, v in plan.items()), max_touched=1.0,
                             link_mbit=link_mbit)
    else:
        raise TesselError(f"plan {plan!r} is neither a strategy nor {{table: strategy}}; strategies: "
                          f"{', '.join(choices.names(TableStrategy))}")
    strategy, overrides = policy.strategy, dict(policy.overrides)
    serves = strategy.served or strategy.ddp_sparse  # a strategy every table is given, not auto or dense
    named = names if serves else list(overrides)
    if not names and serves:
        raise TesselError(f"plan '{strategy.name}' serves tables, and the model has no nn.Embedding or "
                          "nn.EmbeddingBag; use plan='auto' or 'dense' (plain DDP)")
    for name in named:
        given = overrides.get(name, strategy)
        if tied.get(name) and (given.served or given.ddp_sparse):
            raise TesselError(f"table '{name}' shares its weight with {', '.join(tied[name])} (tied), so every row "
                              "gets a gradient and it cannot be served by rows; give it 'dense'")
    return policy


def _table_groups(model: nn.Module, optimizer: torch.optim.Optimizer, found) -> list[int]:
    """Indices of the optimizer's param groups holding the tables ([0] if none do); they must agree."""
    ids = {id(model.get_submodule(i.name).weight) for i in found}
    groups = [k for k, g in enumerate(optimizer.param_groups) if any(id(p) in ids for p in g["params"])] or [0]
    settings = [{k: v for k, v in optimizer.param_groups[k].items() if k != "params"} for k in groups]
    if any(s != settings[0] for s in settings):  # one row optimizer serves every table
        raise TesselError(f"the tables sit in optimizer param groups {groups} with different settings; put them "
                          "in one group (or groups with equal settings) so one row optimizer can mirror it")
    return groups


def _drop_served(optimizer: torch.optim.Optimizer, before: list[nn.Parameter], model: nn.Module) -> None:
    """Take the served tables' weights (no longer the model's parameters) out of the optimizer's groups and
    state: the rows live with their owners now, and a full copy here would undo the memory saved."""
    gone = {id(p) for p in before} - {id(p) for p in model.parameters()}
    for grp in optimizer.param_groups:
        grp["params"] = [p for p in grp["params"] if id(p) not in gone]
    for p in [p for p in optimizer.state if id(p) in gone]:
        del optimizer.state[p]


def prepare(model: nn.Module, optimizer: torch.optim.Optimizer, loader, plan: str | dict | ParallelPlan = "auto", *,
            samples: int = 2, lazy: bool = False, world: int | None = None, link_mbit: float = 0.0,
            max_norm: float = 0.0, resume: str | Path | None = None, timeout: float = 60.0, verbose: bool = True,
            precision: str = "fp32"):
    """(model, optimizer, loader) distributed over torchrun's ranks; see the module docstring.

    ``plan``: ``auto``, a table strategy, {table: strategy}, or a :class:`~tessel.plan.ParallelPlan` (with pp or
    tp: :mod:`tessel.prepare_axes`, the loop calls ``model.step(x, y)``). ``samples``: batches measured to
    decide the tables; ``lazy``: accept lazy row updates for momentum SGD, Adam, AdamW or weight decay;
    ``world``: the rank count the script expects (TesselError if launched with another); ``link_mbit``: the
    link rate ``auto`` assumes (0: probed); ``max_norm``: clipping inside ``model.step`` (pp/tp; otherwise
    call ``tessel.clip_grad_norm_``); ``resume``: a checkpoint folder whose saved table choices and stage cut
    this run keeps, so ``tessel.load`` finds every share where it was saved. ``precision``: ``fp32`` (the model's
    own dtype) or ``bf16-mixed`` (the forward under autocast to bf16, the loop's fp32 weights the masters the
    optimizer updates; activations and looked-up rows cross in bf16, see docs/usage.md "Precision"). Call it on
    every rank, after the model is built with the same weights everywhere (rank 0's are broadcast anyway)."""
    mixed = Settings(precision=precision)  # the one place a precision's name is resolved (a one-line error)
    if isinstance(plan, ParallelPlan):
        if plan.dp_shard > 1:
            plan.check(mixed)
        if plan.pp > 1 or plan.tp > 1:
            _join(timeout, model)
            return prepare_axes(model, optimizer, loader, plan, samples=samples, lazy=lazy, max_norm=max_norm,
                                timeout=timeout, resume=resume, verbose=verbose, precision=mixed.precision)
        world = plan.world
    if max_norm:
        raise TesselError("max_norm clips inside model.step under pp or tp; in a data-parallel loop call "
                          "tessel.clip_grad_norm_(model, max_norm) between backward and optimizer.step")
    group, rank, size, mesh = _world(world, timeout, model)
    prepared_loader = PreparedLoader(loader, rank, size)
    plain = skeleton(model)  # the architecture tessel.unwrap gives back, before tables are taken out
    found = sparse.find_tables(model)
    policy = _table_policy(plan, [i.name for i in found], {i.name: i.shared_with for i in found}, link_mbit)
    groups = _table_groups(model, optimizer, found)
    tables = sparse.SparseTables([], {}, group, 0.0)
    given = policy.given()
    named = any(s.served or s.ddp_sparse for s in given)
    rows = auto_mirror(optimizer, optimizer.param_groups[groups[0]], lazy, named, rank == 0 and verbose)
    if size > 1 and found and rows is not None and any(s.served or s.decides for s in given):
        before = list(model.parameters())
        # a resumed run serves each table as saved (auto may choose otherwise now), as does a plan that decided
        saved = checkpoint_plan(resume)
        fixed = saved.tables if saved else plan.tables if isinstance(plan, ParallelPlan) else ()
        tables = sparse.serve(model, sparse.survey(model, prepared_loader.samples(samples)), policy, rows, group,
                              timeout=timeout, fixed=fixed, wire=mixed.compute_dtype if mixed.precision.compute
                              else None)
        _drop_served(optimizer, before, model)
        if verbose and rank == 0:
            print(tables.describe())
    hook, bucket, low = ((plan.ddp_hook, plan.bucket_mb, plan.reduce_dtype) if isinstance(plan, ParallelPlan)
                         else (True, 0.0, None))
    shards = None
    if isinstance(plan, ParallelPlan) and plan.dp_shard > 1:
        module, shards = _sharded(model, optimizer, plan, mesh, mixed, timeout)
    else:
        module = apply_ddp(model, group, bucket, hook=hook, reduce_dtype=low) if size > 1 else model
    device = next((p.device.type for p in model.parameters()), "cpu")
    prepared = PreparedModel(module, tables, prepared_loader, lambda: mixed.autocast(device), shards)
    prepared.__dict__["skeleton"] = plain  # not a submodule: its meta tensors are no parameters of the model
    return prepared, PreparedOptimizer(optimizer, prepared, groups[0]), prepared_loader


def _plain(model: PreparedModel) -> nn.Module:
    m = model.module
    return m.module if isinstance(m, torch.nn.parallel.DistributedDataParallel) else m


def _identity(model: PreparedModel) -> dict[str, Any]:
    """What a checkpoint must match: the model's class and every tensor's name and shape (tables whole)."""
    identity = identity_of(_plain(model))
    for name, t in (model.tables.tables if model.tables else {}).items():
        identity["model"][f"{name}.weight"] = f"{t.num_embeddings}x{t.embedding_dim}"
    return identity


def save(dir: str | Path, model, optimizer, loader: PreparedLoader, keep: int = 2) -> Path:
    """Checkpoint what ``prepare`` returned into ``dir/step-N`` (N: batches trained), atomically and sealed
    as ``tessel train``'s are (:mod:`tessel.train.checkpoint`): model, optimizer, tables whole with their row
    state, each rank's RNG and loader position, and the plan. Every rank calls it; returns the checkpoint's
    folder. An asynchronous pipeline first applies the mini-batches still in flight."""
    from .train import checkpoint  # DCP takes most of a second to import: only when saving

    model.drain()
    parts = model.checkpoint_parts(optimizer)
    data = {"position": loader.position, "dp_size": loader.size, "global_batch": 0}  # batch size: the loader's
    meta = {**parts["identity"], "plan": parts["plan"].to_dict(), "run": "prepare"}
    return checkpoint.save(dir, loader.steps, parts["module"], parts["optimizer"], data, meta, keep=keep,
                           tables=parts["tables"], tp=parts["tp"])


def load(dir: str | Path, model, optimizer, loader: PreparedLoader) -> int | None:
    """Restore the newest intact checkpoint in ``dir`` (or ``dir`` itself, one checkpoint) into what
    ``prepare`` returned, checksums checked before anything is read; returns its step, or None if ``dir``
    holds none. The next ``iter(loader)`` continues where the saved pass stopped; bit-identical with
    the same ranks and plan (``prepare(..., resume=dir)`` keeps the saved one). A data-parallel loop may resume on
    another rank count (every rank then takes rank 0's RNG state). An LR scheduler's state
    is the caller's to save and restore."""
    from .train import checkpoint

    path = checkpoint.find(dir)
    if path is None:
        return None
    parts = model.checkpoint_parts(optimizer)
    plan, saved = parts["plan"], checkpoint_plan(path)
    # A data-parallel loop resumes on any rank count: the tables are saved whole, DCP reshards the dense weights,
    # and the loader's position counts global batches. Anything else of the plan must be as saved.
    axes = saved is not None and max(plan.pp, plan.tp, saved.pp, saved.tp) > 1
    # saved and resumed both under DDP or both under FSDP (a checkpoint of one resumed under the other is not tested)
    alike = saved is not None and not axes and (saved.dp_shard > 1) == (plan.dp_shard > 1)
    if saved is not None and saved != (dataclasses.replace(plan, dp=saved.dp, dp_shard=saved.dp_shard) if alike
                                       else plan):
        raise TesselError(f"checkpoint '{path}' was saved under {saved.describe()} and this run is "
                          f"{plan.describe()}; prepare with resume='{dir}'" + (" and as many ranks" if axes else "")
                          + " to keep it")
    # on another rank count every rank takes rank 0's RNG state: its own has no counterpart in the checkpoint
    other = saved is not None and saved.dp != plan.dp
    step, data = checkpoint.load(path, parts["module"], parts["optimizer"], parts["identity"],
                                 tables=parts["tables"], tp=parts["tp"], source_rank=0 if other else None)
    loader.load_state_dict({"position": data["position"], "steps": step})
    return step
