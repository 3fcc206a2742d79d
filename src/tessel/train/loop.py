"""The training loop a worker runs: build everything from the config, train, checkpoint, summarise.

Run it on several local workers with ``tessel train --nproc 2`` or under torchrun on several nodes::

    torchrun --nproc-per-node 2 -m tessel train --steps 50
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from .. import comm
from ..config import Config
from ..data import ShardedLoader, build_dataset
from ..errors import CheckpointError
from ..mesh import ParallelDims, build_mesh, init_distributed
from ..models import build_model
from ..parallelize import apply_sparse, parallelize
from ..pipeline.runtime import summary as pipeline_summary
from ..tensor import check_config as check_tensor
from ..tensor.cost import step_formula
from . import checkpoint
from .engine import Engine
from .metrics import MetricsLogger
from .optim import build_optimizer

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def build_data(cfg: Config):
    return build_dataset(
        cfg.data_source, vocab_size=cfg.data.vocab_size, seq_len=cfg.data.seq_len, seed=cfg.train.seed,
        zipf_s=cfg.data.zipf_s, path=cfg.data.path, cache_dir=cfg.data.cache_dir,
        in_features=cfg.model.in_features, classes=cfg.model.classes,
    )


def build(cfg: Config, vocab_size: int) -> torch.nn.Module:
    """The plain single-process model the config describes (seeded by the caller)."""
    m = cfg.model
    return build_model(
        m.name, vocab_size=vocab_size, seq_len=cfg.data.seq_len, dim=m.dim, hidden=m.hidden, layers=m.layers,
        heads=m.heads, dropout=m.dropout, tie_embeddings=m.tie_embeddings, softmax=m.softmax,
        num_sampled=m.num_sampled, in_features=m.in_features, classes=m.classes,
    )


def model_identity(cfg: Config, vocab_size: int) -> dict[str, Any]:
    """What a checkpoint must match to be loaded into this run's model."""
    # ps/allgather tables are saved beside the model, not in it: resuming needs the same table plan.
    sparse = {k: getattr(cfg.sparse, k) for k in ("strategy", "tables", "max_touched")}
    return {"model": {**cfg.to_dict()["model"], "vocab_size": vocab_size, "seq_len": cfg.data.seq_len,
                      "sparse": sparse}}


def peak_memory_bytes() -> int:
    """Peak memory of this rank: device memory on CUDA, else the process's peak resident set."""
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        return int(torch.cuda.max_memory_allocated())
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def table_memory_bytes(tables, dense_tables: list[tuple[torch.nn.Parameter, bool]], optimizer) -> int:
    """Bytes this rank holds for embedding tables: weights, optimizer state and gradients (dense tables)
    or shard, row-optimizer state and the rows pulled for the last batch (ps and allgather tables)."""
    total = tables.memory_bytes() if tables else 0
    for p, sparse_grad in dense_tables:
        state = optimizer.state.get(p, {})
        # A dense gradient of the whole table exists during every step (zero_grad frees it after).
        grad = 0 if sparse_grad else p.numel() * p.element_size()
        total += p.numel() * p.element_size() + grad + sum(
            v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v) and v.dim())
    return total


def _first_batches(loader: ShardedLoader, n: int, model: torch.nn.Module) -> list[tuple]:
    """This rank's first ``n`` batches, read from a copy of the loader so training still starts with them."""
    peek = ShardedLoader(loader.dataset, loader.global_batch, loader.dp_rank, loader.dp_size, seed=loader.seed,
                         shuffle=loader.shuffle)
    dtype = next(model.parameters()).dtype
    return [tuple(t.to(dtype) if t.is_floating_point() else t for t in peek.next_batch()) for _ in range(n)]


def _data_parallel(cfg: Config, model, mesh, dims, loader, saved, identity):
    """Sparse tables out of the model first (a resumed run keeps its saved table plan), then DDP."""
    dp_group = mesh.get_group("dp")
    fixed = saved.get("sparse_plan")
    tables = apply_sparse(model, cfg, _first_batches(loader, cfg.sparse.sample_batches, model), dp_group, fixed)
    if dist.get_rank() == 0 and tables.choices:
        print(tables.describe(), flush=True)
    meta = {**identity, "sparse_plan": {c.info.name: [c.strategy, c.split] for c in tables.choices}}
    ddp_comm = "torch" if cfg.sparse.strategy == "torch-sparse" else cfg.parallel.ddp_comm
    model = parallelize(model, dims, mesh, ddp_comm, cfg.parallel.bucket_mb)
    optimizer = build_optimizer(model.parameters(), cfg.train)
    return model, optimizer, Engine(model, optimizer, cfg.train, tables), tables, meta


def _pipeline(cfg: Config, model, mesh, dims, loader, saved, identity):
    """This rank's stage; a resumed run keeps the stage bounds it was saved with, whatever the profile says."""
    from .. import pipeline

    bounds = saved.get("pipeline_bounds")
    if bounds:
        cfg.pipeline.split = ",".join(str(hi - lo) for lo, hi in bounds)
    built = pipeline.build(model, cfg, mesh, dims, _first_batches(loader, 1, model)[0])
    if dist.get_rank() == 0:
        print(built.plan.describe(), flush=True)
    meta = {**identity, "pipeline_bounds": [list(b) for b in built.plan.bounds]}
    return built.module, built.optimizer, built.engine, None, meta


def _tensor_parallel(cfg: Config, model, mesh, dims, spec):
    """The tensor-parallel model of this rank's grid block, then DDP over its dp group (tp x dp)."""
    from ..tensor import parallelize as tensor_parallelize

    model, tp = tensor_parallelize(model, cfg.tensor.mode, mesh, spec, cfg.tensor.regather)
    if dist.get_rank() == 0:
        kept = {True: " (shards kept for backward, gathered again)", False: " (gathered tensors kept for backward)"}
        print(f"tensor parallel: {spec}{kept[cfg.tensor.regather] if spec.mode in ('2d', '3d') else ''} "
              f"x dp={dims.dp}", flush=True)
    if dims.dp > 1:
        model = parallelize(model, dims, mesh, cfg.parallel.ddp_comm, cfg.parallel.bucket_mb)
    optimizer = build_optimizer(model.parameters(), cfg.train)
    # torch-1d's state dicts already hold DTensors; tessel's shards need their places in the full tensors
    shards = tp if cfg.tensor.mode != "torch-1d" else None
    return model, optimizer, Engine(model, optimizer, cfg.train, tp=tp), shards


def run(cfg: Config) -> dict[str, Any]:
    """Train as one rank of the world torchrun started; returns the run summary (same on every rank)."""
    init_distributed(cfg.parallel.backend, cfg.parallel.timeout)
    rank = dist.get_rank()
    dims = ParallelDims.resolve(dist.get_world_size(), cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp)
    dims.check_batch(cfg.train.global_batch, cfg.train.micro_batches)
    spec = check_tensor(cfg, dims.tp)
    mesh = build_mesh(dims, cfg.parallel.timeout, spec.axes if dims.tp > 1 and spec.mode in ("2d", "3d") else ())
    dp_group = mesh.get_group("dp")

    # The same seed on every rank: identical initial weights, and identical draws for the
    # sampled softmax's candidates, which data-parallel parity relies on.
    torch.manual_seed(cfg.train.seed)
    dataset = build_data(cfg)
    vocab = getattr(dataset, "vocab_size", 0)
    model = build(cfg, vocab).to(DTYPES[cfg.train.dtype])
    if dist.get_backend() == "nccl":
        model = model.cuda()
    identity = model_identity(cfg, vocab)
    if cfg.checkpoint.init_from and not cfg.checkpoint.resume:
        # into the plain model, before any parallelism: the source may have any world size or layout
        source = checkpoint.latest(cfg.checkpoint.init_from) or cfg.checkpoint.init_from  # a run's folder or one step
        checkpoint.load_weights(source, model, identity)
    loader = ShardedLoader(dataset, cfg.train.global_batch, dist.get_rank(dp_group), dims.dp, seed=cfg.train.seed)
    ckpt_dir = cfg.checkpoint_dir
    resume_from = None
    if cfg.checkpoint.resume:
        resume_from = checkpoint.latest(ckpt_dir)
        if resume_from is None:
            raise CheckpointError(f"--resume: no complete checkpoint in '{ckpt_dir}'; train without --resume first")
    saved = checkpoint.read_meta(resume_from) if resume_from else {}
    tp = None
    if dims.tp > 1:
        model, optimizer, engine, tp = _tensor_parallel(cfg, model, mesh, dims, spec)
        tables, meta = None, identity
    elif dims.pp > 1:
        model, optimizer, engine, tables, meta = _pipeline(cfg, model, mesh, dims, loader, saved, identity)
    else:
        model, optimizer, engine, tables, meta = _data_parallel(cfg, model, mesh, dims, loader, saved, identity)
    choices = tables.choices if tables else []
    plain = getattr(model, "module", model)  # the tables are found by their names in the unwrapped model
    dense_tables = [(plain.get_submodule(c.info.name).weight, c.strategy == "torch-sparse") for c in choices
                    if c.strategy in ("dense", "torch-sparse")]

    start = 0
    if resume_from is not None:
        saved_world = saved.get("world_size")
        if saved_world != dims.world_size:
            raise CheckpointError(f"checkpoint '{resume_from}' was saved by {saved_world} ranks and holds per-rank "
                                  f"RNG and data state; resume it with {saved_world} ranks, not {dims.world_size}")
        start, data_state = checkpoint.load(resume_from, model, optimizer, identity, tables, tp)
        loader.load_state_dict(data_state)

    unit = "samples" if cfg.model.name == "classifier" else "tokens"
    per_step = cfg.train.global_batch * (1 if unit == "samples" else cfg.data.seq_len)
    # the last pipeline stage is the one that knows the loss; its first rank logs
    log_rank = (dims.pp - 1) * dims.dp * dims.tp
    logger = MetricsLogger(cfg.metrics.out, cfg.train.steps, start, cfg.metrics.progress, cfg.metrics.log_every,
                           cfg.metrics.tensorboard, enabled=rank == log_rank, resume=cfg.checkpoint.resume)
    run_bytes: dict[str, dict[str, int]] = {}
    comm.counter.end_step()  # set-up traffic (dp.init) is not part of any step
    for step in range(start, cfg.train.steps):
        t0 = time.perf_counter()
        if getattr(engine, "needs_batch", True):
            inputs, targets = loader.next_batch()
        else:
            loader.skip()  # generating a batch costs a middle pipeline stage CPU it needs for its layers
            inputs = targets = None
        # scheduled alltoall tables fetch the next batch's rows during this step
        upcoming = loader.peek()[0] if choices and step + 1 < cfg.train.steps else None
        result = engine.step(inputs, targets, step, upcoming)
        loss = torch.tensor([result.loss], dtype=torch.float64)
        comm.all_reduce(loss, "meta", group=dp_group)
        dt = time.perf_counter() - t0
        step_bytes = comm.counter.end_step()
        for c, v in step_bytes.items():
            acc = run_bytes.setdefault(c, {"sent": 0, "recv": 0})
            acc["sent"] += v["sent"]
            acc["recv"] += v["recv"]
        record = {"step": step + 1, "loss": float(loss) / dims.dp, "lr": result.lr,
                  "grad_norm": result.grad_norm, "step_time": dt, "tokens_per_s": per_step / dt, "bytes": step_bytes}
        if choices:
            record["sparse_busy"], record["sparse_waited"] = tables.timing()
        logger.log_step(record)
        done = step + 1 == cfg.train.steps
        every = cfg.checkpoint.every
        if cfg.checkpoint.enabled and ((every and (step + 1) % every == 0) or done):
            if dims.pp > 1:
                engine.drain(step + 1)  # a checkpoint holds no half-trained mini-batch
            checkpoint.save(ckpt_dir, step + 1, model, optimizer, loader.state_dict(), meta, cfg.checkpoint.keep,
                            tables, tp)

    if dims.pp > 1:
        engine.drain(cfg.train.steps)  # the final weights hold every mini-batch's update
    per_rank = comm.all_gather_object({"bytes": run_bytes, "peak_mem": peak_memory_bytes(),
                                       "act_mem": getattr(engine, "activation_bytes", None),
                                       "table_mem": table_memory_bytes(tables, dense_tables, optimizer),
                                       "pp": engine.stats() if dims.pp > 1 else None}, "meta")
    summary = logger.summary(
        [r["bytes"] for r in per_rank],
        {"model": cfg.model.name, "dims": str(dims), "unit": unit, "out": cfg.metrics.out,
         "plot": cfg.metrics.plot, "tokens_per_step": per_step,
         "peak_mem_per_rank": [r["peak_mem"] for r in per_rank],
         "activation_mem_per_rank": [r["act_mem"] for r in per_rank],
         **({"tensor": str(spec) + (" regather" if cfg.tensor.regather else ""),
             "tensor_formula": step_formula(cfg, dims.dp, spec)} if dims.tp > 1 else {}),
         "table_mem_per_rank": [r["table_mem"] for r in per_rank],
         "sparse_plan": {c.info.name: c.strategy + (f"/{c.split}" if c.strategy == "alltoall" else "")
                         for c in choices},
         **({"pipeline": pipeline_summary([r["pp"] for r in per_rank], engine.plan, cfg.pipeline.schedule,
                                          cfg.train.micro_batches, cfg.pipeline.predict)} if dims.pp > 1 else {})},
    )
    logger.close(summary)
    return summary
