"""The composer: a plain model and a ParallelPlan in, this rank's trainable piece out.

``parallelize`` applies the plan's axes to a plain ``nn.Module`` in one order, each step behind its
predicate, as torchtitan's ``parallelize_llama`` does:

1. the model's tables surveyed (how sparsely sample batches touch them), on the whole plain model;
2. pipeline cut: rank 0 profiles the layer chain and cuts it, this rank keeps its stage (pp > 1);
3. tensor parallelism on the modules the stage holds, through the function registered for the model
   (tp > 1); stage boundary messages become this rank's block of the activation;
4. the stage's tables (or, under tp, this rank's vocabulary shard of them) served row by row over the dp
   group (ps | allgather | alltoall | dense, ``auto`` deciding per table);
5. data-parallel sync: DDP for an unpipelined model, the step tail's flat all-reduce for a stage.

It returns a :class:`Parallelized`, which the trainer steps, checkpoints and summarises without knowing
which axes are on. Run it inside a torchrun worker, e.g.::

    torchrun --nproc-per-node 8 -m tessel train --dp 2 --pp 2 --tp 2 --tp-mode 1d
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from . import buckets as bucket_rule
from . import comm, pipeline, sparse, tensor
from .chain import Chain, Runner, chain_of, recomputed
from .errors import PlanError
from .mesh import sharding, subgroups
from .plan import ParallelPlan, TableChoice
from .registry import spec_of
from .settings import Settings
from .sparse.rowopt import RowOptimizer
from .train.engine import Engine, StepEngine
from .train.optim import build_optimizer
from .train.tail import StepTail


def replicate_from_first(module: torch.nn.Module, group) -> None:
    """Make every rank of ``group`` hold the first rank's parameters and buffers (counted on dp.init)."""
    src = dist.get_process_group_ranks(group)[0]
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            comm.broadcast(t.data, src, "dp.init", group=group)


def auto_bucket_mb(model: torch.nn.Module, buckets: int = 8) -> float:
    """The bucket size tessel's DDP asks for: ``model``'s gradients cut into about ``buckets`` all-reduces
    (:func:`tessel.buckets.auto_mb`).

    >>> auto_bucket_mb(torch.nn.Linear(1024, 4096))  # 16 MiB of fp32 weights
    2.0
    """
    return bucket_rule.auto_mb(sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
                               buckets)


# buffers are not broadcast before each forward (replicate_from_first made them equal; the models keep none that
# change); torch 2.13 names the setting forward_sync_buffers, earlier releases broadcast_buffers
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                   else {"broadcast_buffers": False})


def apply_ddp(model: torch.nn.Module, dp_group, bucket_mb: float = 0.0, *, hook: bool = True,
              reduce_dtype: torch.dtype | None = None) -> DDP:
    """Wrap ``model`` in DDP whose every byte (init and gradients) goes through tessel.comm.

    ``bucket_mb=0`` picks :func:`auto_bucket_mb` for tessel's wrapper. ``hook=False`` leaves DDP exactly as
    torch ships it (its own broadcast and all-reduce, bytes not counted, 25 MB buckets unless ``bucket_mb`` is
    given): the peer that benchmarks compare tessel's wrapper against. ``reduce_dtype`` (bf16, when asked):
    gradients cross in it and are summed in fp32 (``comm.ddp_comm_hook``; torch's own ``bf16_compress_hook``, which
    sums in bf16, where ``hook=False``).
    """
    device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
    if not hook:
        ddp = DDP(model, device_ids=device_ids, process_group=dp_group, bucket_cap_mb=bucket_mb or bucket_rule.TORCH_MB)
        if reduce_dtype is not None:
            if dist.get_backend(dp_group) != "nccl":
                raise PlanError(f"parallel.grad_reduce bf16 with parallel.ddp_comm torch: torch's own bf16 hook needs "
                                f"NCCL, and this job's backend is {dist.get_backend(dp_group)}; valid: "
                                "parallel.ddp_comm tessel, or grad_reduce full")
            ddp.register_comm_hook(dp_group, default_hooks.bf16_compress_hook)
        return ddp
    bucket_mb = bucket_mb or auto_bucket_mb(model)
    replicate_from_first(model, dp_group)
    ddp = DDP(model, device_ids=device_ids, process_group=dp_group, init_sync=False, **_NO_BUFFER_SYNC,
              bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    ddp.register_comm_hook(dp_group, comm.ddp_comm_hook("dp.dense", reduce_dtype))
    return ddp


@dataclass
class Parallelized:
    """This rank's share of the model, ready to train."""

    module: torch.nn.Module  # what is checkpointed: the plain model's names, pruned to the stage, tp layers in it
    optimizer: torch.optim.Optimizer
    engine: StepEngine
    plan: ParallelPlan  # complete: stage bounds and table strategies decided
    settings: Settings
    tables: sparse.SparseTables | None = None
    shards: tensor.TensorParallel | None = None  # places of tensor-parallel shards in full tensors (checkpoints)
    stages: pipeline.StagePlan | None = None

    def describe(self) -> str:
        """The plan as printed at start: degrees and schedule, then the stage cut and the table plan."""
        parts = [self.plan.describe()]
        if self.stages is not None:
            parts.append(self.stages.describe())
            if self.plan.schedule.asynchronous and not self.stages.given:
                # stage k's layers run up to pp - k - 1 updates stale: a cut elsewhere is other math, and the
                # profile's sub-millisecond timings can pick another cut next time
                parts.append(f"  {self.plan.schedule.name}: the cut sets how stale each layer runs; --pipeline.split "
                             f"{pipeline.split_text(self.stages.bounds)} repeats this run's math")
        if self.tables and self.tables.choices:
            parts.append(self.tables.describe())
        return "\n".join(parts)

    def dense_tables(self) -> list[tuple[torch.nn.Parameter, bool]]:
        """(weight, has sparse gradient) of the tables left in the model (dense / torch-sparse)."""
        picked = self.tables.choices if self.tables else []
        return [(self.module.get_submodule(c.info.name).weight, c.strategy.ddp_sparse) for c in picked
                if not c.strategy.served]

    def summary(self, stats: list) -> dict:
        """The run summary's entries about the axes, from every rank's ``engine.stats()``."""
        plan = self.plan
        out: dict[str, Any] = {"plan": plan.to_dict(), "sparse_plan": {t.name: t.describe().split("=", 1)[1]
                                                                       for t in plan.tables}}
        if plan.tp > 1:
            out["tensor"] = str(tensor.GridSpec(plan.tp_mode, plan.tp_grid)) + (" regather" if plan.regather else "")
        if self.stages is not None:
            out["pipeline"] = pipeline.summary(stats, self.stages, plan.schedule, plan.micro_batches, plan.predict)
        return out


def row_optimizer(plan: ParallelPlan, settings: Settings) -> RowOptimizer | None:
    """The served rows' optimizer: the one the plan's table policy names, else the dense optimizer's row mirror
    (None for an optimizer that has none: then no table can be served)."""
    kind = plan.sparse.row_kind(settings.optimizer)
    if not kind:
        return None
    return RowOptimizer(kind, settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay,
                        betas=settings.betas)


def apply_sparse(root: torch.nn.Module, found: sparse.Survey, plan: ParallelPlan, rows: RowOptimizer | None, group,
                 timeout: float, only: list[str] | None = None, share: float = 1.0, agree=None,
                 wire: torch.dtype | None = None):
    """Serve the surveyed tables this rank holds (``only``: a stage's) over ``group`` (its dp group), in place,
    before the stage's data-parallel sync (which must not see them), as the plan's table policy says; tables the
    plan has decided already (a resumed run's) keep their choice. ``share``: the stage's part of the step's
    compute. Returns (tables, the plan with this rank's tables decided)."""
    found = sparse.Survey(found.infos, found.compute * share)
    tables = sparse.serve(root, found, plan.sparse, rows, group, timeout=timeout, fixed=plan.tables, only=only,
                          agree=agree, wire=wire)
    return tables, plan.with_(tables=tuple(TableChoice.of(c) for c in tables.choices))


def _agree(mesh, plan: ParallelPlan):
    """Under tensor parallelism every shard of a table takes the first shard's choice (one plan entry each)."""
    if plan.tp == 1 or not plan.tp_mode.serves_tables:  # 2-D/3-D keep their tables dense (their columns are cut)
        return None
    return lambda picks: comm.all_gather_object(picks, "sparse.plan", mesh.get_group("tp"))[0]


def _stage_tables(found: sparse.Survey, chain: Chain, lo: int, hi: int | None) -> list[str]:
    """The surveyed tables that layers lo..hi-1 own (the input embedding on the first stage, a sampled
    softmax's tables on the last)."""
    owns = [path for layer in chain.layers[lo:hi] for path in layer.owns]
    return [i.name for i in found.infos if any(i.name == p or i.name.startswith(p + ".") for p in owns)]


def check_model(model: torch.nn.Module, plan: ParallelPlan, settings: Settings) -> None:
    """What the model itself allows of ``plan`` (table names, layer count and cut, a tensor-parallel plan
    registered for it, even splits on the grid), checked on a meta-device model before any worker starts;
    ``model`` is changed in place."""
    sparse.check_overrides([i.name for i in sparse.find_tables(model)], plan.sparse.overrides)
    if plan.pp == 1 and plan.tp == 1:
        if plan.recompute.layers:
            try:
                chain_of(model)
            except PlanError as e:
                raise PlanError(f"train.recompute={plan.recompute.name} recomputes per chain layer: {e}") from None
        return
    chain = chain_of(model)
    if plan.pp > 1:
        pipeline.check_model(chain, plan.pieces, plan.bounds)
    if plan.tp > 1:
        per_rank = settings.global_batch // (plan.dp * plan.micro_batches)
        tensor.check_shapes(model, chain, tensor.GridSpec(plan.tp_mode, plan.tp_grid), per_rank)


def _micro(batch: tuple, micro_batches: int) -> tuple:
    """The first micro-batch of ``batch``: what the pipeline profile times each layer on."""
    x, y = batch
    b = x.shape[0] // micro_batches
    return x[:b], y[:b]


def _sparse_grads(model: torch.nn.Module) -> frozenset[int]:
    """Ids of the weights whose gradient is sparse: tables left to torch DDP with ``sparse=True`` (torch-sparse)."""
    return frozenset(id(m.weight) for m in model.modules()
                     if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse)


def parallelize(model: torch.nn.Module, plan: ParallelPlan, mesh, batches: list[tuple], settings: Settings, *,
                make_optimizer: Callable | None = None, rows: RowOptimizer | None = None) -> Parallelized:
    """Apply ``plan`` to the plain ``model`` (same seed, so the same weights, on every rank) on ``mesh``, trained
    as ``settings`` says.

    ``batches``: this rank's first batches (sparse tables measure them, the pipeline profiles the first).
    ``make_optimizer``: (this rank's dense parameters) -> optimizer, and ``rows``: the served tables' row
    optimizer, for a caller mirroring its own optimizer (``tessel.prepare``); by default both follow ``settings``."""
    make_optimizer = make_optimizer or (lambda params: build_optimizer(params, settings, _sparse_grads(model)))
    rows = rows if rows is not None else row_optimizer(plan, settings)
    dp_group = mesh.get_group("dp")
    chain = chain_of(model) if plan.pp > 1 or plan.tp > 1 else None
    # tables are measured on the whole plain model, the only one every rank can run, the way its chain runs it
    run = (lambda m, b: Runner(m, chain)(*b)) if chain is not None else None
    found = sparse.survey(model, batches[:plan.sparse.sample_batches], run)
    root, stages, lo, hi, share, device = model, None, 0, None, 1.0, _device(model, batches)
    # built on the meta device (tessel.materialize): the model as built, to draw each weight's value from
    plain = copy.deepcopy(model) if any(p.is_meta for p in model.parameters()) else None
    ties: list[dict[int, str]] = []
    if plan.pp > 1:
        stages = pipeline.cut(model, chain, plan.pieces, _micro(batches[0], plan.micro_batches), plan.bounds)
        plan = plan.with_(bounds=tuple(tuple(b) for b in stages.bounds))
        ties = pipeline.ties(model, chain, stages.bounds)  # before the cut takes the other stages' modules away
        pipeline.check_ties(ties, _why_no_ties(plan))
        mine = pipeline.held(plan.schedule, mesh.get_local_rank("pp"), plan.pp)  # one stage, or two (torch's)
        lo, hi = stages.bounds[mine[0]]
        share = sum(stages.stage_seconds()[i] for i in mine) / max(sum(stages.stage_seconds()), 1e-12)
        root = pipeline.prune(model, chain, lo, hi, *(stages.bounds[i] for i in mine[1:]))
    handle = shards = None
    spec = tensor.GridSpec(plan.tp_mode, plan.tp_grid)
    if plan.tp > 1 and plan.tp_mode.torch_peer:
        root, handle = tensor.apply_whole(root, spec, mesh, sequence_parallel=plan.sequence_parallel)
    elif plan.tp > 1:
        chain, handle = tensor.apply(root, chain, spec, mesh, plan.regather)
        handle.grid.live_weights = plan.live_backward
        shards = handle
    tables = None
    if plan.serves_tables:  # torch's tensor parallelism and pipeline schedules (the peers) keep tables dense
        only = _stage_tables(found, chain, lo, hi) if chain is not None else None
        tables, plan = apply_sparse(root, found, plan, rows, dp_group, settings.timeout, only, share,
                                    _agree(mesh, plan), settings.wire_dtype)
        if plan.tp > 1 and tables:
            tables.shards_group = mesh.get_group("tp")
        if plan.pp > 1:  # each stage decided its own tables; the plan holds them all, first stage first
            mine = comm.all_gather_object([[t.name, t.strategy.name, t.split] for t in plan.tables], "meta",
                                          mesh.get_group("pp"))
            plan = plan.with_(tables=tuple(TableChoice(*t) for stage in mine for t in stage))
    if plan.recompute.layers:  # after tensor parallelism, before the data-parallel sync (and sharding)
        chain = recomputed(chain if chain is not None else chain_of(root), root, plan.recompute.keeps_matmuls)
    if plan.pp > 1:
        engine, optimizer = _stage_engine(root, chain, plan, settings, mesh, stages, lo, hi, handle, device,
                                          batches[0], tables, make_optimizer, ties, plain)
    else:
        engine, optimizer = _engine(root, chain, plan, settings, mesh, handle, tables, make_optimizer, device, plain)
    return Parallelized(root, optimizer, engine, plan, settings, tables, shards, stages)


def _engine(root, chain: Chain | None, plan: ParallelPlan, settings: Settings, mesh, tp, tables, make_optimizer,
            device: torch.device, plain: torch.nn.Module | None):
    """One stage holding the whole model: DDP syncs gradients during backward (FSDP gathers each layer's weights
    for its forward and backward and reduce-scatters its gradients). ``plain``: the model as built on the meta
    device, whose weights are made once sharded."""
    dp_group = mesh.get_group("dp")
    model = Runner(root, chain) if chain is not None and not plan.tp_mode.torch_peer else root
    if plan.dp_shard > 1:
        try:
            owned = [layer.owns for layer in (chain or chain_of(root)).layers]
        except PlanError:  # no registered chain: the whole model is one unit
            owned = []
        model, shards = shard_model(model, owned, plan, settings, mesh)
        if tp is not None:
            tp.sharded(root, shards)
    _make(model, root, plain, settings, device, tp)
    if plan.dp_shard == 1 and plan.dp > 1:
        # torch DDP's sparse gradients (the peer) run in DDP as torch ships it
        as_shipped = not plan.ddp_hook or plan.sparse.strategy.ddp_sparse or any(
            c.strategy.ddp_sparse for c in (tables.choices if tables else []))
        model = apply_ddp(model, dp_group, plan.bucket_mb, hook=not as_shipped, reduce_dtype=plan.reduce_dtype)
    optimizer = make_optimizer(model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    tail = StepTail(params, optimizer, settings.clip, tp=tp, tables=tables,
                    shard_group=shards if plan.dp_shard > 1 else None)
    return Engine(model, tail, plan.micro_batches, settings.lr_at, tables, lambda: settings.autocast(device.type)), \
        optimizer


def _make(outer: torch.nn.Module, root: torch.nn.Module, plain: torch.nn.Module | None, settings: Settings,
          device: torch.device, tp) -> None:
    """Where the model was built on the meta device (``plain``: it as built), this rank's pieces made now: after
    sharding and tensor parallelism, before the optimizer, DDP or the dp ranks' comparison see them."""
    if plain is None:
        return
    from .materialize import materialize  # (DTensor and DCP's helpers take a second to import: only here)

    materialize(outer, root, plain, settings.seed, device, tp)


def shard_model(model: torch.nn.Module, owned: list[tuple[str, ...]], plan: ParallelPlan, settings: Settings, mesh):
    """(FSDP2 over groups of dp_shard dp ranks, the group a rank's shards are among): the modules each of
    ``owned`` (the chain layers' module paths, those this rank holds) a unit, then the root; under mixed
    precision the weights are gathered in the compute dtype. Served tables hold no parameters (their rows live on
    their owners), so nothing of them is sharded. HSDP where dp_shard < dp: see :mod:`tessel.fsdp`."""
    prefix = "root." if isinstance(model, Runner) else ""
    found = dict(model.named_modules())  # a pipeline stage holds only its own layers' modules
    paths = [tuple(prefix + o for o in owns if o and prefix + o in found) for owns in owned]
    replicate_from_first(model, mesh.get_group("dp"))  # the same weights everywhere before each keeps its shard
    gathered = settings.compute_dtype if settings.precision.compute else None  # bf16 weights cross in bf16
    from . import fsdp  # torch's FSDP and DTensor take a second to import: only where weights are sharded

    shard_mesh, replicas = sharding(mesh, plan.dp_shard, settings.timeout)
    model = fsdp.apply_fsdp(model, shard_mesh, fsdp.units(model, paths), gathered, replicas, plan.reduce_dtype)
    return model, shard_mesh.get_group()


def builds_on_meta(model_on_meta: torch.nn.Module, plan: ParallelPlan, tables: list, init_from: str) -> bool:
    """Whether a run builds its model on the meta device and makes each rank's pieces only once parallelized
    (tessel.materialize; ``model_on_meta``: the plain model built there to ask): a rank keeps part of the model
    (its weights sharded, a pipeline stage, tensor-parallel blocks, tessel's own), its class registers an
    ``init``, and nothing needs the whole model's values first: a weights-only start (``init_from``) loads into
    the plain model, a pipeline without a given cut times the layers to cut them, tables served by rows (or
    decided by measuring them) take their rows from the model, and torch's schedules and tensor parallelism (the
    peers) are run as torch ships them."""
    served = bool(tables) and plan.serves_tables and any(s.served or s.decides for s in plan.sparse.given())
    partial = plan.dp_shard > 1 or plan.pp > 1 or plan.tp > 1
    peers = (plan.tp > 1 and plan.tp_mode.torch_peer) or (plan.pp > 1 and plan.schedule.torch_peer)
    return (partial and not peers and spec_of(model_on_meta).init is not None and not init_from
            and (plan.pp == 1 or bool(plan.bounds)) and not served)


def _device(model: torch.nn.Module, batches: list[tuple]) -> torch.device:
    """Where the whole model lives, taken before serving: a stage whose only layer is a served table holds no
    parameter left to say so (comm.device() would say the backend's device, the CPU under gloo). A model built
    on the meta device is made later where its batches are (tessel.materialize)."""
    found = next((p.device for p in model.parameters()), comm.device())
    if found.type == "meta":
        found = next((t.device for t in (batches[0] if batches else ()) if torch.is_tensor(t)), comm.device())
    return found


def _why_no_ties(plan: ParallelPlan) -> str | None:
    """Why this plan cannot keep a weight tied across stages, or None."""
    if plan.schedule.asynchronous:
        return f"{plan.schedule.name} updates on each stage at its own time, so the copies would drift apart"
    if plan.schedule.torch_peer:
        return f"{plan.schedule.name} (torch's) updates stages where tessel cannot sum their gradients"
    if plan.tp > 1:
        return "tensor parallelism cuts the table and the head differently"
    return None


def _tied(root: torch.nn.Module, ties: list[dict[int, str]], index: int, pp_group, timeout: float) -> list[tuple]:
    """(parameter, group of the stages holding it, whether this stage counts it in the norm) for each weight this
    stage shares with another; making the groups is collective over the world (every rank calls it)."""
    ranks = dist.get_process_group_ranks(pp_group)
    mine = [t for t in ties if index in t]
    groups = subgroups([[ranks[s] for s in sorted(t)] for t in mine], timeout) if ties else []
    return [(root.get_parameter(t[index]), g, index == min(t)) for t, g in zip(mine, groups)]


def _stage_engine(root, chain: Chain, plan: ParallelPlan, settings: Settings, mesh, stages, lo: int, hi: int, tp,
                  device: torch.device, batch: tuple, tables, make_optimizer, ties: list[dict[int, str]],
                  plain: torch.nn.Module | None):
    """A pipeline stage: the step tail averages its gradients over its dp group, sums tied weights' gradients
    between the stages that hold them, and sums the norm over pp (``plain``: as in :func:`_engine`)."""
    pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    runner = Runner(root, chain, lo, hi)
    sharded = plan.dp_shard > 1
    if sharded:  # FSDP syncs the stage's gradients (the last micro-batch's backward reduce-scatters their sum)
        if ties:
            raise PlanError("parallel.dp_shard with a weight tied across pipeline stages: the stages' copies would "
                            "be summed shard by shard; valid: model.tie_embeddings false, or dp_shard 1")
        runner, shards = shard_model(runner, [layer.owns for layer in chain.layers[lo:hi]], plan, settings, mesh)
        if tp is not None:
            tp.sharded(root, shards)
    _make(runner, root, plain, settings, device, tp)
    if not sharded and plan.dp > 1:
        replicate_from_first(runner, dp_group)
    tied = _tied(root, ties, mesh.get_local_rank("pp"), pp_group, settings.timeout)
    optimizer = make_optimizer(runner.parameters())
    params = [p for p in runner.parameters() if p.requires_grad]
    tail = StepTail(params, optimizer, settings.clip, dp_group=None if sharded else dp_group, tp=tp, tables=tables,
                    norm_group=pp_group, tied=tied, shard_group=shards if sharded else None,
                    reduce_dtype=plan.reduce_dtype)
    micro = batch[0].shape[0] // plan.micro_batches
    index = mesh.get_local_rank("pp")
    stage = pipeline.Stage(runner, index, plan.pp, dist.get_process_group_ranks(pp_group), stages, micro,
                           settings.wire_dtype, pp_group, pipeline.held(plan.schedule, index, plan.pp),
                           micro_batches=plan.micro_batches, compute_in=settings.torch_dtype, device=device)
    autocast = lambda: settings.autocast(device.type)  # noqa: E731
    if plan.schedule.torch_peer:
        engine = pipeline.TorchPipelineEngine(stage, chain, tail, plan.schedule, plan.micro_batches, settings.lr_at,
                                              stages, autocast)
    else:
        engine = pipeline.PipelineEngine(stage, chain, tail, plan.schedule, plan.micro_batches, settings.lr_at,
                                         plan.predict, tables, autocast, delay_lr=plan.delay_lr)
    return engine, optimizer
