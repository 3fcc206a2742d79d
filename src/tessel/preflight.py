"""Checks run once in the launching process, so bad input fails in a second, not after N workers start.

Everything here is also checked (or would fail) inside the workers; doing it first turns a crash
of every worker into one line and exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from . import tensor
from .chain import chain_of
from .config import Config
from .errors import ConfigError, PlanError
from .mesh import default_backend
from .meta import on_meta
from .parallelize import check_model
from .plan import ParallelPlan, TableChoice, saved_plan
from .planner.job import Job
from .planner.memory import fsdp_units, stage_memory
from .planner.profile import Profile, TableProfile, measure_memory
from .planner.topology import CPU_UNIT_MEMORY
from .resolve import job_of, on_cpu, plan_of, settings_of
from .settings import DTYPES
from .sparse import find_tables
from .sparse.cost import env_link_mbit
from .sparse.detect import measure as measure_tables
from .sparse.plan import forced
from .sparse.serve import rows_whole, split_of
from .sparse.served import TableUse
from .train.build import build, build_data, model_identity
from .train.resume import find_start

# Peak bytes per class-mean element while GaussianClassification generates them (measured with tracemalloc: uint64
# hashes and float64 uniforms and normals, 4 bytes of which are kept).
MEANS_PEAK_BYTES = 40


def _check_machine(cfg: Config) -> None:
    """What the config cannot know alone: the backend this torch build has and the GPUs its local workers need, the
    link rate the emulated cluster passes in the environment, output folders it may write."""
    if cfg.parallel.backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise ConfigError("parallel.backend 'nccl' needs CUDA GPUs and a CUDA build of torch; this one has none; "
                          "valid here: auto, gloo")
    if cfg.parallel.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("parallel.device 'cuda' needs a CUDA GPU and a CUDA build of torch; this one has none; "
                          "valid here: auto, cpu")
    backend = default_backend() if cfg.parallel.backend == "auto" else cfg.parallel.backend
    # NCCL refuses two ranks on one device, and only once every worker has started
    if backend == "nccl" and cfg.nproc > (gpus := torch.cuda.device_count()):
        said = "'nccl'" if cfg.parallel.backend == "nccl" else "'auto' (nccl on this CUDA machine)"
        raise ConfigError(f"parallel.backend {said} gives each local worker a GPU of its own, and {cfg.nproc} workers "
                          f"were asked for on a host with {gpus}; valid: parallel.nproc <= {gpus}, or parallel.backend "
                          "gloo with parallel.device cuda (workers share the GPUs)")
    env_link_mbit()
    _check_writable(Path(cfg.metrics.out), "metrics.out")
    if cfg.checkpoint.enabled:
        _check_writable(cfg.checkpoint_dir, "checkpoint.dir")


def _check_writable(folder: Path, key: str) -> None:
    """Make ``folder`` and a file in it as the run will, then remove what this made: a refused job leaves nothing."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ConfigError(f"{key} '{folder}' cannot be written ({e.strerror or type(e).__name__}); "
                          "give a folder you may create files in") from None
    finally:
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _check_memory(cfg: Config, model: torch.nn.Module) -> None:
    """Refuse sizes this machine cannot hold before anything is allocated (a MemoryError, or the OOM killer once
    pages are touched, would come later): every local worker builds the whole model on the CPU, and the classifier's
    data generates classes x in_features means through float64 temporaries."""
    params = list(model.named_parameters())
    weights = sum(p.numel() for _, p in params) * DTYPES[cfg.train.dtype].itemsize
    means = cfg.model.classes * cfg.model.in_features * MEANS_PEAK_BYTES if cfg.data_source == "gaussian" else 0
    need, have = cfg.nproc * (weights + means), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need <= have:
        return
    name, big = max(params, key=lambda item: item[1].numel())
    data = f" + {_gib(means)} to generate the class means" if means else ""
    raise ConfigError(f"model '{cfg.model.name}' needs about {_gib(need)}: {cfg.nproc} workers x ({_gib(weights)} "
                      f"of weights{data}), more than this machine's {_gib(have)}; the largest tensor is {name} "
                      f"{' x '.join(map(str, big.shape))}: make model.* or data.* smaller")


def predicted_memory(cfg: Config, plan: ParallelPlan, dataset=None, use: TableUse | None = None
                     ) -> list[float] | None:
    """The planner's peak bytes per rank of each pipeline stage under ``plan`` (its bounds), from the plain
    model's layers measured at the run's micro-batch; None where a rank holds several stages or the model has
    no chain of layers. ``use``: what the run's tables measured and do; without it (before the workers start)
    the tables the plan's strategy will serve are decided and measured here as the workers will."""
    if plan.schedule.stages_per_rank > 1 and plan.pp > 1:
        return None
    job = job_of(cfg, dataset)
    samples = max(1, job.settings.global_batch // (plan.dp * plan.micro_batches))
    try:
        profile = measure_memory(job, samples)
        if use is None:
            plan = _served_tables(job, plan, profile)
        return stage_memory(plan, job.settings, profile, use)
    except PlanError:
        return None


def _served_tables(job: Job, plan: ParallelPlan, profile: Profile) -> ParallelPlan:
    """Before the workers start: ``plan`` with the tables its strategy will serve, decided as the workers decide
    them (:func:`tessel.sparse.plan.forced` on the plain model's tables measured at the plan's dp, rank 0's
    batch), and ``profile``'s tables with the rows a rank looks up and whether the batch feeds them. Under tensor
    parallelism a table a layer cuts by columns stays dense, as the workers keep it. ``auto`` weighs costs on the
    live link and is left to the workers: its tables stay priced as dense weights, the larger of the two."""
    policy = plan.sparse
    if plan.tables or not policy.strategy.served or not plan.serves_tables or not profile.tables:
        return plan
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.settings.seed)
        model = job.build()
    infos = [i for i in find_tables(model) if i.unsupported is None]
    measure_tables(model, infos, [job.batch(job.settings.global_batch, plan.dp)])
    modules, overrides = dict(model.named_modules()), dict(policy.overrides)
    whole = _whole_rows(job, plan, infos)
    picks = [forced(i, modules[i.name], policy.strategy, overrides.get(i.name), policy.max_touched) for i in infos
             if i.name in whole]
    tables = tuple(TableChoice(c.info.name, c.strategy, split_of(c.info.dim, plan.dp, policy.split)
                               if c.strategy.splits else "")
                   for c in picks if c is not None and c.strategy.served)
    profile.tables = [TableProfile(i.name, i.rows, i.dim, i.fed, {plan.dp: i.unique_per_step}, i.ahead, i.route_from)
                      for i in infos]
    return dataclasses.replace(plan, tables=tables)


def _whole_rows(job: Job, plan: ParallelPlan, infos) -> set[str]:
    """The tables of ``infos`` whose rows ``plan``'s tensor-parallel layers leave whole (all of them without
    tensor parallelism): the layers applied to the model built on the meta device, as the workers apply them."""
    if plan.tp == 1:
        return {i.name for i in infos}
    with on_meta():
        model = job.build()
    tensor.apply(model, chain_of(model), tensor.GridSpec(plan.tp_mode.name, tuple(plan.tp_grid)))
    return {i.name for i in infos if rows_whole(model, i) is not None}


def held_beside(cfg: Config, plan: ParallelPlan, dataset=None) -> list[float]:
    """Bytes each stage's ranks hold beside their tensors for FSDP's units, where that counts against a rank's
    memory (the CPU's: ``Topology.unit_memory``), as the planner prices them; zeros elsewhere."""
    if plan.dp_shard == 1 or not on_cpu(cfg):
        return [0.0] * plan.pp
    bounds = plan.bounds
    if not bounds:
        with on_meta():
            bounds = ((0, len(chain_of(job_of(cfg, dataset).build()).layers)),)
    return [CPU_UNIT_MEMORY * n for n in fsdp_units(plan, bounds)]


def check_fits(plan: ParallelPlan, predicted: list[float] | None, memory_gib: float,
               held: list[float] | None = None) -> None:
    """Refuse ``plan`` in one line where its fullest rank is predicted over ``memory_gib`` (its tensors, and
    ``held``: what each stage holds beside them, :func:`held_beside`)."""
    needs = [p + h for p, h in zip(predicted or [], held or [0.0] * len(predicted or []))]
    if not needs or max(needs) <= memory_gib * 2**30:
        return
    shard = f" dp_shard={plan.dp_shard}" if plan.dp_shard > 1 else ""
    need, limit = max(needs) / 2**20, memory_gib * 1024
    beside = f", {max(held) / 2**20:,.1f} MiB of it beside its tensors for FSDP's units" if held and max(held) else ""
    raise PlanError(f"plan dp={plan.dp}{shard} pp={plan.pp} tp={plan.tp} needs {need:,.1f} MiB on its fullest rank "
                    f"(predicted{beside}), over plan.memory_gib={memory_gib:g} ({limit:,.0f} MiB); valid: a plan "
                    "that fits (tessel plan --memory-per-rank lists them), sharding (--dp-shard), recompute "
                    "(--train.recompute layers), more ranks, or a smaller batch")


def preflight(cfg: Config, world_size: int | None = None, plan: ParallelPlan | None = None) -> ParallelPlan:
    """Validate the plan (degrees, batch, schedule, axes), the model's arguments and shapes, data files and
    the checkpoint to start or resume from; returns the plan. ``plan``: the run's (a plan file's or the
    planner's), else the one the config's flags ask for."""
    settings = settings_of(cfg)
    plan = (plan or plan_of(cfg, world_size or cfg.nproc)).check(settings)
    _check_machine(cfg)
    # Text is tokenized and cached once here, before the workers read it; the classifier's data (classes x
    # in_features means) is made only after the memory check.
    dataset = None if cfg.data_source == "gaussian" else build_data(cfg)
    vocab = getattr(dataset, "vocab_size", 0)
    with on_meta():  # checks the model's arguments without allocating its weights
        model = build(cfg, vocab)
    _check_memory(cfg, model)
    if dataset is None:
        dataset = build_data(cfg)
    check_model(model, plan, settings)
    if cfg.plan.memory_gib and (plan.pp == 1 or plan.bounds):  # (a cut made from timings: checked once made)
        check_fits(plan, predicted_memory(cfg, plan, dataset), cfg.plan.memory_gib, held_beside(cfg, plan, dataset))
    identity = model_identity(cfg, vocab, plan)
    if cfg.checkpoint.init_from or cfg.checkpoint.resume:
        # here, not at the top: torch's checkpoint package takes a second to import, on the launcher's path before
        # any worker starts, and only a run that reads a checkpoint needs it
        from .train import checkpoint
    if cfg.checkpoint.init_from:
        path = checkpoint.latest(cfg.checkpoint.init_from) or cfg.checkpoint.init_from
        checkpoint.inspect(path, identity, weights_only=True)
    if cfg.checkpoint.resume:  # the newest intact checkpoint (damaged ones are skipped, and said so, in rank 0)
        start = find_start(cfg.checkpoint_dir, resume=True, restarted=False)
        _, meta = checkpoint.inspect(start.path, identity, verify=False)
        saved_plan(meta, plan, start.path)
        checkpoint.same_optimizer(meta, settings.optimizer.name, start.path)
    return plan
