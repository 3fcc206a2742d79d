"""A config resolved, once, into what carries its behaviour: the :class:`~tessel.plan.ParallelPlan` (how the model
is spread), the :class:`~tessel.settings.Settings` (how it trains), the planner's :class:`~tessel.planner.job.Job`
and :class:`~tessel.planner.topology.Topology`. Only this module, the command line and the training loop read a
:class:`~tessel.config.Config`; the composer, the planner and ``tessel.prepare`` take what is made here.

    >>> from tessel.config import load_config
    >>> cfg = load_config(None, ["parallel.pp=2", "pipeline.schedule=gpipe", "pipeline.split=1,2",
    ...                          "sparse.tables=tok_emb=ps"])
    >>> plan = plan_of(cfg, world=4)
    >>> plan.dp, plan.schedule.name, plan.bounds, plan.sparse.of("tok_emb").name
    (2, 'gpipe', ((0, 1), (1, 3)), 'ps')
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from .config import Config, sparse_overrides
from .errors import ConfigError, PlanError
from .mesh import ParallelDims
from .plan import ParallelPlan, TablePolicy
from .settings import Settings
from .tensor.grid import GridSpec


def settings_of(cfg: Config) -> Settings:
    t = cfg.train
    return Settings(optimizer=t.optimizer, lr=t.lr, momentum=t.momentum, betas=(t.beta1, t.beta2),
                    momentum_decay=t.momentum_decay, weight_decay=t.weight_decay,
                    lr_schedule=t.schedule, warmup=t.warmup, min_lr_ratio=t.min_lr_ratio, steps=t.steps, clip=t.clip,
                    dtype=t.dtype, global_batch=t.global_batch, seed=t.seed, timeout=cfg.parallel.timeout,
                    precision=t.precision)


def policy_of(cfg: Config) -> TablePolicy:
    s = cfg.sparse
    return TablePolicy(strategy=s.strategy, overrides=tuple(sparse_overrides(cfg).items()), split=s.split,
                       schedule=s.schedule, prefetch_all=s.prefetch_all, max_touched=s.max_touched,
                       partitions=s.partitions, hosts=s.hosts,
                       link_mbit=s.link_mbit, sample_batches=s.sample_batches, row_optimizer=s.optimizer)


def bounds_of(split: str) -> tuple[tuple[int, int], ...]:
    """Layer counts per stage ("3,3,2") as [lo, hi) bounds; the model's chain checks them against its layers.

    >>> bounds_of("3,3,2"), bounds_of("")
    (((0, 3), (3, 6), (6, 8)), ())
    """
    if not split.strip():
        return ()
    try:
        counts = [int(c) for c in split.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise PlanError(f"pipeline.split '{split}' must be layer counts >= 1 per stage joined by commas, e.g. '3,3,2'")
    edges = [0]
    for c in counts:
        edges.append(edges[-1] + c)
    return tuple(zip(edges, edges[1:]))


def plan_of(cfg: Config, world: int) -> ParallelPlan:
    """The plan the config's flags ask for on ``world`` ranks (degrees resolved, grid chosen), unchecked."""
    p = cfg.parallel
    dims = ParallelDims.resolve(world, p.dp, p.pp, p.tp)
    grid = GridSpec.parse(cfg.tensor.mode, dims.tp, cfg.tensor.grid)
    bounds = bounds_of(cfg.pipeline.split) if dims.pp > 1 else ()
    return ParallelPlan(dp=dims.dp, pp=dims.pp, tp=dims.tp, tp_mode=grid.mode, tp_grid=grid.shape,
                        regather=cfg.tensor.regather, sequence_parallel=cfg.tensor.sequence_parallel,
                        schedule=cfg.pipeline.schedule, predict=cfg.pipeline.predict, delay_lr=cfg.pipeline.delay_lr,
                        micro_batches=cfg.train.micro_batches, bounds=bounds, sparse=policy_of(cfg),
                        ddp_hook=p.ddp_comm == "tessel", bucket_mb=p.bucket_mb, grad_reduce=p.grad_reduce,
                        dp_shard=dims.dp if p.dp_shard == 0 else p.dp_shard, recompute=cfg.train.recompute)


def load_plan(path: str | Path) -> ParallelPlan:
    """A plan saved by ``tessel plan --json`` (or a run's summary "plan"), checked to be one."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"plan.source '{path}' is not a file; valid: auto, or the .json a 'tessel plan --json' "
                          "wrote")
    try:
        return ParallelPlan.from_json(path.read_text())
    except (ValueError, TypeError, PlanError, ConfigError) as e:
        raise ConfigError(f"plan file '{path}' is not a parallel plan ({e}); write one with tessel plan "
                          "--json") from None


def saved_plan_for(cfg: Config, world: int) -> ParallelPlan:
    """``plan.source``'s file, which must be for ``world`` ranks: the run is parallelized as the file says. A file
    written before plans carried the table policy and the DDP sync takes those from the config."""
    plan = load_plan(cfg.plan.source)
    written = json.loads(Path(cfg.plan.source).read_text())
    flags = plan_of(cfg, plan.world)
    plan = plan.with_(**{k: getattr(flags, k) for k in ("sparse", "ddp_hook", "bucket_mb", "grad_reduce", "dp_shard")
                         if k not in written})
    if world and plan.world != world:
        raise PlanError(f"plan file '{cfg.plan.source}' is for {plan.world} ranks (dp={plan.dp} pp={plan.pp} "
                        f"tp={plan.tp}) but this job has {world}; run it with {plan.world} ranks or plan again for "
                        f"{world}")
    return plan


def job_of(cfg: Config, dataset=None):
    """What the planner needs of the config's model and data (built lazily, in the training dtype); ``dataset``:
    the run's own, where it has one already."""
    from .data.loader import ShardedLoader
    from .planner.job import Job
    from .train.build import build, build_data

    settings = settings_of(cfg)
    dataset = dataset or build_data(cfg)  # now, not inside a meta-device build: its tensors must be real
    vocab = getattr(dataset, "vocab_size", 0)

    def model():
        return build(cfg, vocab).to(settings.torch_dtype)

    def batch(global_batch: int, dp: int) -> tuple:
        x = ShardedLoader(dataset, global_batch, 0, dp, seed=cfg.train.seed).next_batch()
        return tuple(t.to(settings.torch_dtype) if t.is_floating_point() else t for t in x)

    # what every candidate keeps whatever its degrees: the table policy, the DDP hook and buckets, regather (and
    # recompute as given, each candidate also priced with every layer recomputed)
    base = ParallelPlan(dp=1, regather=cfg.tensor.regather, sparse=policy_of(cfg),
                        ddp_hook=cfg.parallel.ddp_comm == "tessel", bucket_mb=cfg.parallel.bucket_mb,
                        grad_reduce=cfg.parallel.grad_reduce, recompute=cfg.train.recompute)
    return Job(build=model, batch=batch, settings=settings, base=base)


def on_cpu(cfg: Config) -> bool:
    """Whether the ranks will keep their tensors in the host's memory (parallel.device, auto: a GPU where the
    backend will be nccl)."""
    import torch

    if cfg.parallel.device != "auto":
        return cfg.parallel.device == "cpu"
    return cfg.parallel.backend == "gloo" or not torch.cuda.is_available()


def topology_of(cfg: Config, ranks: int, measured: dict | None = None, calibration=None):
    """The topology the config and environment describe; ``measured``: a probe's latencies, speed, rate, overlap,
    wait after compute, quota and FSDP's rates (see :mod:`tessel.planner.probe`), or ``calibration``: a trial's
    (:mod:`tessel.planner.calibrate`), with ``measured`` then holding only what a trial does not time
    (probe.beside_trial); they replace the defaults but not values given in ``plan.*``."""
    from .planner.topology import CPU_UNIT_MEMORY, beside_trial, from_environment, probed

    p = cfg.plan
    memory = p.memory_gib * 2**30 if p.memory_gib else math.inf
    topo = from_environment(ranks, p.hosts, p.link_mbit, memory=memory, headroom=p.memory_headroom)
    if on_cpu(cfg):  # a rank's memory is the host's: what FSDP's units hold beside their tensors counts
        topo = replace(topo, unit_memory=CPU_UNIT_MEMORY)
    if calibration is not None:
        topo = calibration.apply(topo)
    if measured and "latency" in measured and calibration is None:
        topo = probed(topo, measured,
                      topo.source + ", latency, speed, rate, overlap, waits, quota and FSDP's rates measured")
    elif measured:  # (beside a trial, the probe measures only what the trial does not)
        topo = replace(beside_trial(topo, measured), source=topo.source + ", waits, quota and FSDP's rates probed")
    if p.latency_us:  # a given value wins over a measured one, for every call
        topo = replace(topo, latency=p.latency_us * 1e-6, tiny_latency=0.0, source=topo.source + ", latency given")
    if p.speed:
        topo = replace(topo, speed=p.speed, source=topo.source + ", speed given")
    return topo
