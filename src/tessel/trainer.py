"""The training loop a worker runs: plan, compose, train, checkpoint, summarise.

Run it on several local workers with ``tessel train --nproc 2`` or under torchrun on several nodes::

    torchrun --nproc-per-node 8 -m tessel train --dp 2 --pp 2 --tp 2 --tp-mode 1d --steps 50
    torchrun --nproc-per-node 4 --max-restarts 3 -m tessel train --ckpt-every 10   # restarted workers resume

After an elastic restart the workers continue from this run's newest intact checkpoint
(:mod:`tessel.train.resume`); SIGTERM stops every rank after the same step with a checkpoint
(:mod:`tessel.train.preempt`).

The loop knows no parallel axis: :func:`tessel.parallelize.parallelize` turns the plan into one object
whose engine steps, whose module and optimizer are checkpointed, and whose summary describes the axes.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import comm, netif, sparse
from .config import Config
from .data import ShardedLoader
from .errors import CheckpointError, PlanError, Preempted
from .mesh import build_mesh, device_type, init_distributed
from .meta import on_meta
from .parallelize import Parallelized, builds_on_meta, parallelize
from .plan import ParallelPlan, regrouped, saved_plan
from .planner import calibrate, probe
from .preflight import check_fits, held_beside, predicted_memory
from .resolve import job_of, plan_of, saved_plan_for, settings_of, topology_of
from .settings import Settings
from .sparse.schedule import WAITS
from .sparse.served import table_use
from .tensor.cost import step_formula
from .train.build import build, build_data, model_identity
from .train.integrity import set_aside
from .train.memory import (
    PeakTensors,
    allocator_bytes,
    anonymous_bytes,
    held_tensors,
    model_state_bytes,
    peak_memory_bytes,
    release_free,
    resident_bytes,
    table_memory_bytes,
)
from .train.metrics import WAIT_PREFIX, MetricsLogger, human_bytes
from .train.preempt import StopOnSignal
from .train.resume import Start, find_start, restart_count


def _first_batches(loader: ShardedLoader, n: int, device, dtype: torch.dtype) -> list[tuple]:
    """This rank's first ``n`` batches, read from a copy of the loader so training still starts with them (on the
    model's device and in its dtype: the survey and the profile run the model on them)."""
    peek = ShardedLoader(loader.dataset, loader.global_batch, loader.dp_rank, loader.dp_size, seed=loader.seed,
                         shuffle=loader.shuffle)
    return [tuple(t.to(device, dtype if t.is_floating_point() else t.dtype) for t in peek.next_batch())
            for _ in range(n)]


def _find_start(cfg: Config) -> Start:
    """Rank 0 reads and hashes the checkpoints once; every rank gets its answer."""
    answer = None
    if dist.get_rank() == 0:
        try:
            if cfg.checkpoint.enabled or cfg.checkpoint.resume:
                answer = vars(find_start(cfg.checkpoint_dir, cfg.checkpoint.resume, restart_count() > 0))
                for path, _ in answer["skipped"]:
                    set_aside(Path(path))
            else:
                answer = vars(Start(None, ""))
        except CheckpointError as e:
            answer = {"error": str(e)}
    answer = comm.from_rank_0(answer)
    if "error" in answer:
        raise CheckpointError(answer["error"])
    return Start(**answer)


def _resume_point(cfg: Config, plan: ParallelPlan, settings: Settings) -> tuple[Start, ParallelPlan]:
    """(where to start, the plan with the checkpoint's stage cut and tables if it resumes one)."""
    start = _find_start(cfg)
    if start.path is None:
        return start, plan
    from .train import checkpoint  # DCP with DTensor: not imported by the launcher and its refusals (tessel/dtensor.py)

    meta = checkpoint.read_meta(start.path)
    saved = saved_plan(meta, plan, start.path)
    checkpoint.same_optimizer(meta, settings.optimizer.name, start.path)
    # a resumed run keeps the stage bounds and table strategies it was saved with, whatever profile says now
    resumed = regrouped(plan, saved, settings.global_batch).with_(bounds=saved.bounds, tables=saved.tables)
    if resumed.micro_batches != plan.micro_batches and dist.get_rank() == 0:
        print(f"tessel: dp {saved.dp} -> {plan.dp} with the global batch kept: {resumed.micro_batches} micro-batches "
              "per rank keep each micro-batch no larger than the checkpoint's", flush=True)
    trained_in = meta.get("precision", "fp32")  # checkpoints from before it was recorded were all fp32
    if trained_in != settings.precision.name and dist.get_rank() == 0:
        print(f"tessel: the checkpoint was trained in {trained_in}; this run continues in {settings.precision.name} "
              "from its fp32 masters", flush=True)
    return start, resumed.check(settings)


def _auto_plan(cfg: Config, world: int) -> ParallelPlan:
    """``--plan auto`` under plain torchrun: the planner run once on rank 0, its winner handed to every rank. Every
    rank first takes part in the probe, or with ``plan.trial``, in the calibration trial (the model's steps and
    each kind of collective, timed on the job's own hosts; the probe where the trial fails) and what of the probe's
    the trial does not time (its wait after compute, the quota, FSDP's rates)."""
    chosen = None
    job = job_of(cfg) if cfg.plan.trial or dist.get_rank() == 0 else None  # the trial runs the model on every rank
    trial = calibrate.attempt(lambda: calibrate.run_trial(job)) if cfg.plan.trial else None
    # a call's latency, its wait after compute and the share of a core each gets, timed with a data-parallel mesh held
    # as a job holds one
    measured = probe.measure(timeout=cfg.parallel.timeout) if trial is None else probe.beside_trial(
        timeout=cfg.parallel.timeout)
    if dist.get_rank() == 0:
        planned = calibrate.choose_calibrated(job, lambda cal: topology_of(cfg, world, measured, cal), trial,
                                              cfg.plan.allow_async)
        print(planned.table(), flush=True)
        chosen = planned.best.plan.to_json()
    return ParallelPlan.from_json(comm.from_rank_0(chosen))


def _plan_for_world(cfg: Config, world: int, settings: Settings) -> ParallelPlan:
    """The run's plan on ``world`` ranks: a plan file's exactly as it says, the planner's pick, or the config's
    flags. After an elastic restart the world may have re-formed smaller (a host lost under ``torchrun --nnodes
    MIN:MAX``); a layout that no longer fits is said so, as one line."""
    try:
        if cfg.plan.source == "auto":
            return _auto_plan(cfg, world).check(settings)
        if cfg.plan.source:
            return saved_plan_for(cfg, world).check(settings)
        return plan_of(cfg, world).check(settings)
    except PlanError as e:
        if not restart_count():
            raise
        raise PlanError(f"the job re-formed on {world} ranks after restart {restart_count()}, where its layout "
                        f"cannot run: {e}. Leave --dp unset so dp follows the world, and give torchrun --nnodes a "
                        "minimum at which pp x tp still fits") from None


def _build(cfg: Config, mesh, plan: ParallelPlan, settings: Settings):
    """(the composed model, its loader, the checkpoint identity, the checkpoint to resume from)."""
    # The same seed on every rank: identical initial weights, and identical draws for the
    # sampled softmax's candidates, which data-parallel parity relies on.
    torch.manual_seed(settings.seed)
    dataset = build_data(cfg)
    vocab = getattr(dataset, "vocab_size", 0)
    device = torch.device(device_type(cfg.parallel.device))
    with on_meta():  # shapes only: whether this run makes its weights after parallelizing
        plain = build(cfg, vocab).to(settings.torch_dtype)
    if builds_on_meta(plain, plan, sparse.find_tables(plain), cfg.checkpoint.init_from):
        with on_meta():
            model = build(cfg, vocab).to(settings.torch_dtype)
    else:
        model = build(cfg, vocab).to(device, settings.torch_dtype)
    identity = model_identity(cfg, vocab, plan)
    start, plan = _resume_point(cfg, plan, settings)
    if cfg.checkpoint.init_from and start.path is None:
        from .train import checkpoint

        # into the plain model, before any parallelism: the source may have any world size or layout
        source = checkpoint.latest(cfg.checkpoint.init_from) or cfg.checkpoint.init_from  # a run's folder or a step
        checkpoint.load_weights(source, model, identity)
    loader = ShardedLoader(dataset, settings.global_batch, mesh.get_local_rank("dp"), plan.dp, seed=settings.seed)
    batches = _first_batches(loader, max(1, plan.sparse.sample_batches), device, settings.torch_dtype)
    return parallelize(model, plan, mesh, batches, settings), loader, identity, start


def _predicted(cfg: Config, par: Parallelized, dataset) -> list[float] | None:
    """The plan's predicted peak per rank of each stage (rank 0 profiles the layers once; every rank gets it),
    where the run reports memory or holds plans to a limit; a plan over ``plan.memory_gib`` is refused here,
    the stage cut being made by now (a cut from timings could not be checked before the workers)."""
    wanted = cfg.metrics.memory or cfg.plan.memory_gib
    use = table_use(par.tables if wanted else None)
    mine = predicted_memory(cfg, par.plan, dataset, use) if dist.get_rank() == 0 and wanted else None
    predicted = comm.from_rank_0(mine)
    if cfg.plan.memory_gib:
        check_fits(par.plan, predicted, cfg.plan.memory_gib, held_beside(cfg, par.plan, dataset))
    return predicted


def _source_rank(rank: int, plan: ParallelPlan, path: str) -> int:
    """The saving rank at this rank's (pp, tp) place with dp index 0: dp replicas share one RNG stream and data
    position, so a job re-formed with another dp takes its state from there."""
    from .train import checkpoint

    saved = ParallelPlan.from_dict(checkpoint.read_meta(path)["plan"])
    if saved.dp == plan.dp:
        return rank
    (_, pp_stride), tp = plan.dims.strides()["pp"], rank % plan.tp
    return saved.dims.rank(rank // pp_stride, 0, tp)


def _say_start(begin: Start, step: int) -> None:
    for line in begin.notes():
        print(line, flush=True)
    if restart_count() or begin.skipped:
        where = f"step {step} ('{begin.path}')" if begin.path else "step 0 (no checkpoint of this run yet)"
        print(f"tessel: restart {restart_count()}: continuing from {where}" if restart_count()
              else f"tessel: resuming from {where}", flush=True)


def _stop(rank: int, step: int, cfg: Config) -> None:
    message = (f"stopped by SIGTERM after step {step}; its checkpoint is in '{cfg.checkpoint_dir}' (a restart or "
               "--resume continues from it)")
    if rank == 0 and restart_count() < int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0):
        print(f"tessel: {message}", flush=True)  # the agent restarts us without a word; say why
    raise Preempted(message)


def _summary(cfg: Config, par: Parallelized, logger: MetricsLogger, run_bytes: dict, per_step: int,
             unit: str, measured: int | None = None, predicted: list[float] | None = None,
             mesh_stage: int = 0, wire: int | None = None) -> dict[str, Any]:
    """``measured``: this rank's peak tensor bytes in one step; ``predicted``: the planner's, per stage; ``wire``:
    what metrics.interface sent over the steps (tessel/netif.py)."""
    mine = {"bytes": run_bytes, "wire": wire, "peak_mem": peak_memory_bytes(), "step_peak": measured,
            "predicted": predicted[mesh_stage] if predicted else None,
            "act_mem": getattr(par.engine, "activation_bytes", None),
            "table_mem": table_memory_bytes(par.tables, par.dense_tables(), par.optimizer),
            "state_mem": model_state_bytes(par.module.parameters(), par.optimizer), "stats": par.engine.stats()}
    per_rank = comm.all_gather_object(mine, "meta")
    axes = par.summary([r["stats"] for r in per_rank])
    if par.plan.tp > 1 and par.plan.pp == 1:  # what the blocks should send on channel tp (a stage holds only some)
        axes["tensor_formula"] = step_formula(cfg, par.plan, par.settings.wire_dtype.itemsize)
    return logger.summary(
        [r["bytes"] for r in per_rank],
        {"model": cfg.model.name, "dims": f"dp={par.plan.dp} pp={par.plan.pp} tp={par.plan.tp} "
                                          f"(world {par.plan.world})",
         "precision": par.settings.precision.name,
         "unit": unit, "out": cfg.metrics.out, "plot": cfg.metrics.plot, "tokens_per_step": per_step,
         "peak_mem_per_rank": [r["peak_mem"] for r in per_rank],
         "activation_mem_per_rank": [r["act_mem"] for r in per_rank],
         "table_mem_per_rank": [r["table_mem"] for r in per_rank],
         "state_mem_per_rank": [r["state_mem"] for r in per_rank],
         "step_peak_mem_per_rank": [r["step_peak"] for r in per_rank],
         "predicted_mem_per_rank": [r["predicted"] for r in per_rank],
         **({"wire_sent_per_rank": [r["wire"] for r in per_rank], "wire_interface": cfg.metrics.interface}
            if wire is not None else {}),
         **axes})


def _draw(loader, reads: str | None):
    """This rank's (inputs, targets) of the next batch, one call per step; what the engine does not read
    (``reads``: "batch", "targets" or None) is not generated, which would cost a stage CPU its layers need."""
    def targets_only():
        return None, loader.next_targets()

    def nothing():
        loader.skip()
        return None, None

    return {"batch": loader.next_batch, "targets": targets_only, None: nothing}[reads]


def _add(run_bytes: dict, step_bytes: dict) -> None:
    for c, v in step_bytes.items():
        acc = run_bytes.setdefault(c, {"sent": 0, "recv": 0})
        acc["sent"] += v["sent"]
        acc["recv"] += v["recv"]


def _log_rank(rank: int, mesh, engine) -> int:
    """The rank that logs every step: the last on rank 0's pipeline group whose stage computes the loss."""
    pp_ranks = comm.all_gather_object(dist.get_process_group_ranks(mesh.get_group("pp")) if rank == 0 else None,
                                      "meta")[0]
    knows = comm.all_gather_object(engine.computes_loss, "meta")
    return next(r for r in reversed(pp_ranks) if knows[r])


def _with_state(record: dict, logger: MetricsLogger, tables) -> dict:
    """``record`` with this rank's memory (where the logger writes it: every step, or every rank's every
    log_every) and the tables' busy and waiting seconds."""
    if logger.enabled or record["step"] % logger.log_every == 0:
        # memory now: resident, its anonymous part, the allocator's bytes in use
        record.update(rss=resident_bytes(), anon=anonymous_bytes(), heap=allocator_bytes())
    if tables:
        busy, waits, work = tables.timing()
        record.update(sparse_busy=busy, sparse_work=work,
                      **{f"{WAIT_PREFIX}{k}": waits.get(k, 0.0) for k in WAITS})  # WAITS' order, 0 if none
    return record


def _checkpoint_due(cfg: Config, done: int) -> bool:
    every = cfg.checkpoint.every
    return cfg.checkpoint.enabled and ((every and done % every == 0) or done == cfg.train.steps)


def run(cfg: Config) -> dict[str, Any]:
    """Train as one rank of the world torchrun started; returns the run summary (same on every rank)."""
    init_distributed(cfg.parallel.backend, cfg.parallel.timeout, cfg.parallel.device)
    rank = dist.get_rank()
    settings = settings_of(cfg)
    plan = _plan_for_world(cfg, dist.get_world_size(), settings)
    mesh = build_mesh(plan.dims, settings.timeout, plan.mesh_axes, cfg.parallel.device)
    dp_group = mesh.get_group("dp")
    par, loader, identity, begin = _build(cfg, mesh, plan, settings)
    predicted = _predicted(cfg, par, loader.dataset)
    if rank == 0:
        print(par.describe(), flush=True)
        if predicted:
            print(f"memory per rank predicted: {', '.join(human_bytes(b) for b in predicted)}"
                  f"{' (stage by stage)' if len(predicted) > 1 else ''}; measured in the run's second step", flush=True)
    # the precision is recorded, not matched: the masters are fp32 in both, so a run resumes in either
    meta = {**identity, "plan": par.plan.to_dict(), "run": begin.run, "optimizer": settings.optimizer.name,
            "precision": settings.precision.name}

    start = 0
    if begin.path is not None:
        from .train import checkpoint

        start, data_state = checkpoint.load(begin.path, par.module, par.optimizer, identity, par.tables, par.shards,
                                            verify=False,  # rank 0 has just checked every file
                                            source_rank=_source_rank(rank, plan, begin.path))
        loader.load_state_dict(data_state)
    if rank == 0:
        _say_start(begin, start)

    unit = "samples" if cfg.model.name == "classifier" else "tokens"
    per_step = cfg.train.global_batch * (1 if unit == "samples" else cfg.data.seq_len)
    log_rank = _log_rank(rank, mesh, par.engine)
    logger = MetricsLogger(cfg.metrics.out, cfg.train.steps, start, cfg.metrics.progress, cfg.metrics.log_every,
                           cfg.metrics.tensorboard, enabled=rank == log_rank, resume=begin.path is not None,
                           rank=rank)
    run_bytes: dict[str, dict[str, int]] = {}
    engine, tables = par.engine, par.tables if par.tables and par.tables.choices else None
    comm.counter.end_step()  # set-up traffic (dp.init) is not part of any step
    stop = StopOnSignal() if cfg.checkpoint.enabled else None
    draw = _draw(loader, engine.reads)
    measured = None
    wire = netif.sent_bytes(cfg.metrics.interface) if cfg.metrics.interface else None
    for step in range(start, cfg.train.steps):
        t0 = time.perf_counter()
        inputs, targets = draw()
        # scheduled alltoall tables fetch the next batch's rows during this step
        upcoming = loader.peek() if tables and step + 1 < cfg.train.steps else None
        # the run's second step (the optimizer's state exists by then) counts the tensor bytes alive at its peak
        with (PeakTensors([*held_tensors(par.module, par.optimizer), *(tables.held_tensors() if tables else ())])
              if step == start + 1 and cfg.metrics.memory else contextlib.nullcontext()) as peak:
            result = engine.step(inputs, targets, step, upcoming)
        if engine.reads == "batch" and step + 1 < cfg.train.steps:
            loader.peek()  # the next batch is made while the device finishes this step (read() waits for it)
        result = result.read()
        measured = peak.bytes if peak is not None else measured
        loss = torch.tensor([result.loss], dtype=torch.float64, device=comm.device())
        comm.all_reduce(loss, "meta", group=dp_group)
        dt = time.perf_counter() - t0
        step_bytes = comm.counter.end_step()
        _add(run_bytes, step_bytes)
        record = {"step": step + 1, "loss": float(loss) / plan.dp, "lr": result.lr,
                  "grad_norm": result.grad_norm, "step_time": dt, "tokens_per_s": per_step / dt, "bytes": step_bytes}
        logger.log_step(_with_state(record, logger, tables))
        release_free(step + 1)  # malloc's free holes back to the system (train/memory.py)
        stopping = stop is not None and stop.requested() and step + 1 < cfg.train.steps
        if _checkpoint_due(cfg, step + 1) or stopping:
            engine.drain(step + 1)  # a checkpoint holds no half-trained mini-batch
            from .train import checkpoint

            checkpoint.save(cfg.checkpoint_dir, step + 1, par.module, par.optimizer, loader.state_dict(), meta,
                            cfg.checkpoint.keep, par.tables, par.shards)
        if stopping:
            _stop(rank, step + 1, cfg)
    if stop is not None:
        stop.close()
    wire = netif.sent_bytes(cfg.metrics.interface) - wire if wire is not None else None

    engine.drain(cfg.train.steps)  # the final weights hold every mini-batch's update
    summary = _summary(cfg, par, logger, run_bytes, per_step, unit, measured, predicted, mesh.get_local_rank("pp"),
                       wire)
    logger.close(summary)
    return summary
