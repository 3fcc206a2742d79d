"""dp × pp × tp composed by one composer: equal to single-process training, bytes exact, checkpoints portable.

One 8-rank gloo world runs every composed layout through ``tessel.parallelize.parallelize`` (the trainer's
own path): pp2 × tp4 (2-D 2x2, 3-D 2x2x1), dp2 × pp2 × tp2 (1-D), pp2 × tp2 × dp2 (3-D 2x1x1), and the
classifier under tp in every mode, alone and with pp. fp64, clipping on, to 1e-10: the loss, every
gradient before each optimizer step and every parameter after. The asynchronous schedules are checked
against the same schedule on the plain pipeline (tensor parallelism is exact, so the staleness and the
numbers must be the same) and for convergence.
"""

import copy
import json

import pytest
import torch
import torch.distributed as dist

from composed import check_before_workers, planned
from steps import TorchReference
from tessel import comm
from tessel.choices import schedule as schedule_of
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.errors import PlanError
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.plan import ParallelPlan
from tessel.tensor.grid import Grid, GridSpec
from tessel.train.build import build, build_data
from tessel.train.checkpoint import load_weights, save

ATOL = 1e-10
B, T, H, V = 8, 8, 16, 64  # global batch, sequence length, width, vocabulary
MODELS = {
    "transformer_lm": ["model.name=transformer_lm", f"model.dim={H}", "model.layers=2", "model.heads=4",
                       f"data.vocab_size={V}", f"data.seq_len={T}"],
    "classifier": ["model.name=classifier", "model.in_features=24", "model.hidden=32", "model.layers=3",
                   "model.classes=8"],
}
LAYOUTS = {  # name -> config keys (world 8)
    "pp2-tp4-2d": ["parallel.pp=2", "parallel.tp=4", "tensor.mode=2d"],
    "pp2-tp4-3d": ["parallel.pp=2", "parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1"],
    "pp2-tp4-1d": ["parallel.pp=2", "parallel.tp=4", "tensor.mode=1d"],
    "pp2-tp4-3d-z2": ["parallel.pp=2", "parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x1x2"],  # gathers weights
    "dp2-pp2-tp2-1d": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=1d"],
    "pp2-tp2-dp2-3d": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=3d", "tensor.grid=2x1x1"],
    "tp4-1d-dp2": ["parallel.tp=4", "tensor.mode=1d"],
    "tp4-2d-dp2": ["parallel.tp=4", "tensor.mode=2d"],
    "tp8-3d": ["parallel.tp=8", "tensor.mode=3d"],
    "pp2": ["parallel.pp=2"],
    "pp2-dp4-sharded": ["parallel.pp=2", "parallel.dp_shard=0"],  # FSDP over each stage's 4 dp ranks
    # FSDP over tessel's tensor-parallel blocks: each dp rank keeps a dim-0 chunk of its tp rank's block
    "dp2-pp2-tp2-1d-sharded": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=1d",
                               "parallel.dp_shard=2"],
    "tp4-3d-dp2-sharded": ["parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1", "parallel.dp_shard=2"],
    "tp2-1d-dp4-hsdp": ["parallel.tp=2", "tensor.mode=1d", "parallel.dp_shard=2"],  # 2 replicas of 2-way shards
    # the same, its tables served by rows (ps, alltoall) over each stage's dp ranks beside the sharded blocks
    "dp2-pp2-tp2-1d-sharded-ps": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=1d",
                                  "parallel.dp_shard=2", "sparse.strategy=ps", "train.weight_decay=0",
                                  "train.momentum=0"],
    "dp2-pp2-tp2-1d-sharded-a2a": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=1d",
                                   "parallel.dp_shard=2", "sparse.strategy=alltoall", "train.weight_decay=0",
                                   "train.momentum=0"],
}


def _cfg(model, layout, schedule, optimizer, micro, extra=()):
    split = "1,1,1,1" if schedule_of(schedule).stages_per_rank > 1 else "2,2"
    return load_config(None, [*MODELS[model], *LAYOUTS[layout], "train.dtype=float64", f"train.global_batch={B}",
                              f"train.micro_batches={micro}", f"train.optimizer={optimizer}", "train.lr=0.05",
                              "train.warmup=1", "train.clip=0.5", f"pipeline.schedule={schedule}",
                              # both models: 4 layers, 2 per stage (torch's multi-stage schedules: 1 per stage)
                              f"pipeline.split={split}", *extra])


def _compose(cfg, meta: bool = False):
    """``meta``: the model tessel parallelizes is built on the meta device (tessel.materialize makes each rank's
    shards), the reference built whole as always."""
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    vocab = getattr(data, "vocab_size", 0)
    torch.manual_seed(settings.seed)
    model = build(cfg, vocab).double()
    ref = copy.deepcopy(model)
    if meta:
        with torch.device("meta"):
            model = build(cfg, vocab).double()
    dp_rank = mesh.get_local_rank("dp")
    loader = ShardedLoader(data, B, dp_rank, plan.dp)
    x, y = ShardedLoader(data, B, dp_rank, plan.dp).next_batch()
    par = parallelize(model, plan, mesh, [(x.double() if x.is_floating_point() else x, y)], settings)
    return par, ref, loader, ShardedLoader(data, B, 0, 1), mesh


def _local(par, name, full):
    """This rank's block of a full tensor of the plain model (a sharded weight's: its FSDP shard)."""
    p = dict(par.module.named_parameters())[name]
    block = par.shards.grid.local(full, p.tp_split) if par.shards is not None else full
    if hasattr(p, "to_local"):  # FSDP's Shard(0): torch.chunk's pieces over the dp ranks, the last ones maybe short
        group = par.engine.tail.shard_group  # (not the DTensor's mesh: a reused world's cached specs hold stale ones)
        chunks, index = block.chunk(dist.get_world_size(group), dim=0), dist.get_rank(group)
        return chunks[index] if index < len(chunks) else block[:0]
    return block


def _grads_before_step(optimizer, named):
    seen = []
    optimizer.register_step_pre_hook(
        lambda opt, a, k: seen.append({n: p.grad.detach().clone() for n, p in named if p.grad is not None}))
    return seen


def check_parity(model, layout, schedule, optimizer, micro, steps=3, meta=False, extra=()):
    cfg = _cfg(model, layout, schedule, optimizer, micro, extra)
    par, ref, loader, ref_loader, mesh = _compose(cfg, meta)
    ref_engine = TorchReference(ref, cfg.train)
    mine = list(par.module.named_parameters())
    grads = _grads_before_step(par.optimizer, mine)
    ref_grads = _grads_before_step(ref_engine.optimizer, list(ref.named_parameters()))
    stage = getattr(par.engine, "stage", None)  # pipelined: the rank holding the last stage (ZBV: pp rank 0)
    last = stage is None or stage.last
    f = (lambda t: t.double() if t.is_floating_point() else t)
    for step in range(steps):
        x, y = loader.next_batch()
        rx, ry = ref_loader.next_batch()
        res = par.engine.step(f(x), y, step)
        ref_res = ref_engine.step(f(rx), ry, step)
        mean = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(mean, "meta", group=mesh.get_group("dp"))
        if last:
            assert abs(float(mean) / par.plan.dp - ref_res.loss) < ATOL, (float(mean), ref_res.loss)
        assert abs(res.grad_norm - ref_res.grad_norm) < ATOL, (res.grad_norm, ref_res.grad_norm)
        for n, g in grads[step].items():
            g = g.to_local() if hasattr(g, "to_local") else g
            torch.testing.assert_close(g, _local(par, n, ref_grads[step][n]), rtol=0, atol=ATOL, msg=f"{n} {step}")
    if par.plan.dp_shard > 1:  # every dense weight is FSDP's (this rank's chunk), none kept whole
        assert all(hasattr(p, "to_local") for _, p in mine), [n for n, p in mine if not hasattr(p, "to_local")]
    ref_params = dict(ref.named_parameters())
    shard = (lambda t: t.to_local() if hasattr(t, "to_local") else t)  # noqa: E731
    for n, p in mine:
        torch.testing.assert_close(shard(p), _local(par, n, ref_params[n].detach()), rtol=0, atol=ATOL, msg=n)
    assert len(grads) == steps and grads[0]
    return sorted(n for n, _ in mine)


COMPOSED = [("pp2-tp4-2d", "gpipe", "sgd"), ("pp2-tp4-3d", "1f1b", "adamw"), ("dp2-pp2-tp2-1d", "1f1b", "adamw"),
            ("dp2-pp2-tp2-1d", "gpipe", "sgd"), ("pp2-tp2-dp2-3d", "gpipe", "adamw"),
            # torch's schedules (the peers) on the same tensor-parallel stages: PipelineStage infers the boundary
            # shapes by running the stage, so every tp rank runs its collectives alike
            ("dp2-pp2-tp2-1d", "torch-1f1b", "sgd"), ("pp2-tp4-3d", "torch-interleaved-zb", "adamw"),
            ("pp2-tp4-2d", "torch-zbv", "sgd"),
            # FSDP on each stage: the last micro-batch's backward reduce-scatters the step's gradient sum
            ("pp2-dp4-sharded", "1f1b", "adamw"), ("pp2-dp4-sharded", "gpipe", "sgd"),
            ("dp2-pp2-tp2-1d-sharded", "1f1b", "adamw"), ("dp2-pp2-tp2-1d-sharded", "gpipe", "sgd"),
            # row mirrors exact against torch's dense SGD (Adagrad's would be too, but it divides the key bias's
            # zero-in-theory gradient, 1e-17 of rounding, by its own root: 1e-10 apart after 3 steps)
            ("dp2-pp2-tp2-1d-sharded-ps", "1f1b", "sgd"), ("dp2-pp2-tp2-1d-sharded-a2a", "gpipe", "sgd")]


@pytest.mark.parametrize("layout,schedule,optimizer", COMPOSED)
def test_transformer_composed_matches_single_process(world8, layout, schedule, optimizer):
    owned = world8.run(check_parity, "transformer_lm", layout, schedule, optimizer, 2)
    assert owned[0] != owned[-1]  # the first and the last rank hold different stages
    if schedule_of(schedule).stages_per_rank > 1:  # two of 4 one-layer stages per rank: 0 and 2, or in a V 0 and 3
        zbv = schedule == "torch-zbv"  # pp rank 0 (ranks 0-3) holds stages 0 and 3, pp rank 1 stages 1 and 2
        assert "tok_emb.weight" in owned[0] and "blocks.1.attn.q_proj.weight" in owned[-1 if zbv else 0]
        assert "head.weight" in owned[0 if zbv else -1]
    else:
        assert "blocks.0.attn.q_proj.weight" in owned[0] and "head.weight" in owned[-1]


@pytest.mark.parametrize("layout,optimizer", [("tp4-3d-dp2-sharded", "adamw"), ("tp2-1d-dp4-hsdp", "sgd")])
def test_sharded_tensor_parallel_matches_single_process(world8, layout, optimizer):
    """FSDP (and HSDP) over tessel's tensor-parallel blocks, unpipelined: 3-D 2x2x1 sharded over 2 dp ranks, 1-D
    over 2-way shards with 2 replicas; micro-batches defer the reduce-scatter to the last one."""
    world8.run(check_parity, "transformer_lm", layout, "gpipe", optimizer, 2)


@pytest.mark.parametrize("layout,schedule,optimizer", [
    ("pp2-dp4-sharded", "1f1b", "adamw"), ("dp2-pp2-tp2-1d-sharded", "gpipe", "sgd"),
    ("tp4-3d-dp2-sharded", "gpipe", "adamw"), ("tp2-1d-dp4-hsdp", "gpipe", "sgd"),
    ("dp2-pp2-tp2-1d", "1f1b", "adamw"), ("pp2-tp4-3d", "1f1b", "adamw")])
def test_model_built_on_meta_matches_single_process(world8, layout, schedule, optimizer):
    """A run that builds its model on the meta device and makes only the pieces each rank keeps (tessel.materialize:
    each weight drawn whole from the model's registered init, one at a time, cut as a checkpoint is loaded) starts
    from exactly the one-process model built whole and trains as it: FSDP over pipeline stages, over 1-D and 3-D
    tensor-parallel blocks, HSDP, and replicated stages and blocks."""
    world8.run(check_parity, "transformer_lm", layout, schedule, optimizer, 2, 3, True, ["sparse.strategy=dense"])


@pytest.mark.parametrize("layout", ["tp4-1d-dp2", "tp4-2d-dp2", "tp8-3d", "pp2-tp4-3d", "dp2-pp2-tp2-1d"])
def test_classifier_tensor_parallel_matches_single_process(world8, layout):
    schedule = "1f1b" if "pp" in layout else "gpipe"
    world8.run(check_parity, "classifier", layout, schedule, "adamw", 2)


def check_async(layout, schedule, variant, steps):
    """Losses of the last stage and the stage-local gradient norms of an asynchronous schedule."""
    extra = [f"pipeline.predict={variant}", "train.momentum=0.9", "train.warmup=0", "train.lr=0.1"]
    cfg = _cfg("transformer_lm", layout, schedule, "sgd", 1, extra)
    par, _, loader, _, mesh = _compose(cfg)
    out = []
    for step in range(steps):
        x, y = loader.next_batch()
        res = par.engine.step(x, y, step)
        out.append((res.loss, res.grad_norm))
    par.engine.drain(steps)
    return out, mesh.get_local_rank("pp")


@pytest.mark.parametrize("layout,schedule,variant", [
    ("pp2-tp4-3d", "async", "v1"), ("pp2-tp4-3d", "async-stash", "v1"), ("pp2-tp4-3d", "async-predict", "v1"),
    ("pp2-tp4-3d", "async-predict", "v2"), ("pp2-tp4-1d", "async-predict", "v1"),
    ("pp2-tp4-3d-z2", "async-predict", "v1"), ("pp2-tp4-3d-z2", "async", "v1"), ("pp2-tp4-2d", "async", "v1"),
    ("pp2-tp4-3d", "async-predict", "opt"), ("pp2-tp4-1d", "async-predict", "opt")])
def test_async_composed_equals_plain_pipeline(world8, world2, layout, schedule, variant):
    """Tensor parallelism is exact, so pp2 x tp4 runs every asynchronous schedule with the very staleness and
    numbers of the plain 2-stage pipeline: losses and stage norms equal step by step. async-stash and
    async-predict v2 reuse the forward's weights in backward; async and async-predict v1 read newer ones there,
    so the GEMMs gather their weight shards (and the fused q/k/v concatenate theirs) again in backward, and v1
    rebuilds each predicted shard where it lies (1-D's shards are row blocks of the full weights)."""
    steps = 5
    composed = world8.run(check_async, layout, schedule, variant, steps)
    plain = world2.run(check_async, "pp2", schedule, variant, steps)
    for got, stage in composed:
        want = plain[stage][0]
        for (loss, norm), (ref_loss, ref_norm) in zip(got, want):
            assert abs(loss - ref_loss) < ATOL and abs(norm - ref_norm) < ATOL, (schedule, got, want)
    assert composed[-1][0][0][0] > 0  # the last stage computed losses


def test_async_predict_composed_converges(world8, world2):
    """pp2 x tp4 3-D with SpecTrain's schedule learns as the flushed 1f1b does (30 steps, same data). The flushed
    run is the plain 2-stage pipeline's: tensor parallelism is exact (the test above), so it is pp2 x tp4's."""
    steps = 30
    flushed = world2.run(check_async, "pp2", "1f1b", "v1", steps)[-1][0]
    predicted = world8.run(check_async, "pp2-tp4-3d", "async-predict", "v1", steps)[-1][0]
    first, end, ref_end = (sum(x[0] for x in seq) / len(seq) for seq in (predicted[:3], predicted[-5:],
                                                                          flushed[-5:]))
    assert end < 0.9 * first, predicted
    assert end < ref_end * 1.1 + 0.05, (predicted, flushed)


def check_bytes(layout="dp2-pp2-tp2-1d"):
    """One step of ``layout`` (1f1b where pipelined), 2 micro-batches, one block per stage."""
    cfg = _cfg("transformer_lm", layout, "1f1b", "sgd", 2)
    par, _, loader, _, mesh = _compose(cfg)
    x, y = loader.next_batch()
    comm.counter.end_step()
    par.engine.step(x, y, 0)
    return comm.counter.end_step(), mesh.get_local_rank("pp")


def _block_1d_tp2() -> int:
    """One block's local parameters under 1-D tp=2: norms and out biases whole, the rest halved."""
    f = 4 * H
    return 2 * 2 * H + (3 * H * H + 3 * H) // 2 + H * H // 2 + H + (f * H + f) // 2 + H * f // 2 + H


def test_composed_bytes_exact(world8):
    m, micro, e = B // 2 // 2 * T, 2, 8  # rows per micro-batch on a dp rank; micro-batches; fp64 bytes
    ring = lambda n: 2 * (2 - 1) * n * e // 2  # an all-reduce of n elements over 2 ranks, bytes sent
    block = _block_1d_tp2()
    params = {0: V // 2 * H + T * H + block, 1: block + 2 * H + V // 2 * H}
    for got, stage in world8.run(check_bytes):
        # stage boundary: each micro-batch's whole (1-D) residual forward, its gradient back
        assert got["pp"] == {"sent": micro * m * H * e, "recv": micro * m * H * e}, got
        # a block's four linears all-reduce M x H once each (q/k/v fused), per micro-batch
        assert got["tp"]["sent"] == micro * 4 * ring(m * H), got
        assert got["dp.dense"]["sent"] == ring(params[stage]), (stage, got)
        assert got["tp.grads"]["sent"] == ring(1)  # the squared norm over the grid; 1-D has no partial grads
        if stage == 0:  # Megatron's embedding: the output all-reduced
            assert got["tp.embed"]["sent"] == micro * ring(m * H) and "tp.head" not in got
        else:  # head: the input gradient all-reduced; the loss: max and (sum, picked) per row, on its own channel
            assert got["tp.head"]["sent"] == micro * ring(m * H) and got["tp.loss"]["sent"] == micro * (
                ring(m) + ring(2 * m)), got
            assert "tp.embed" not in got


def test_sharded_tensor_parallel_bytes_exact(world8):
    """HSDP over 1-D tp=2 blocks (tp2 x dp4, 2-way shards, 2 replicas), one step of 2 micro-batches: every unit's
    block gathered before its forward and again before its backward per micro-batch, (s - 1) / s of it sent by
    each rank; its gradient reduce-scattered once and the shard all-reduced over the 2 replicas. Every dim 0 here
    is even, so FSDP pads nothing."""
    s, r, micro, e = 2, 2, 2, 8
    block = V // 2 * H + T * H + 2 * _block_1d_tp2() + 2 * H + V // 2 * H  # the whole model's 1-D tp=2 block
    for got, _ in world8.run(check_bytes, "tp2-1d-dp4-hsdp"):
        assert got["dp.gather"]["sent"] == 2 * micro * block // s * (s - 1) * e, got
        assert got["dp.scatter"]["sent"] == block // s * (s - 1) * e, got
        assert got["dp.replicate"]["sent"] == 2 * (r - 1) * (block // s) * e // r, got
        assert "dp.dense" not in got


def check_save(tmp, layout):
    cfg = _cfg("transformer_lm", layout, "1f1b", "adamw", 2)
    par, _, loader, _, mesh = _compose(cfg)
    for step in range(2):
        x, y = loader.next_batch()
        par.engine.step(x, y, step)
    save(tmp, 2, par.module, par.optimizer, loader.state_dict(), {"model": {}}, tables=par.tables, tp=par.shards)
    return {n: p.detach().clone() for n, p in par.module.named_parameters()}


def check_load(tmp, layout):
    cfg = _cfg("transformer_lm", layout, "1f1b", "adamw", 2)
    par, _, _, _, _ = _compose(cfg)
    load_weights(f"{tmp}/step-00000002", par.module, {"model": {}}, par.shards)
    grid = par.shards.grid if par.shards else None
    return ({n: (p.detach().clone(), getattr(p, "tp_split", None)) for n, p in par.module.named_parameters()},
            (grid.spec, grid.coords) if grid else None)


@pytest.mark.parametrize("saved,loaded", [("dp2-pp2-tp2-1d", "tp4-2d-dp2"), ("pp2-dp4-sharded", "dp2-pp2-tp2-1d"),
                                          ("tp4-3d-dp2-sharded", "dp2-pp2-tp2-1d")])
def test_composed_checkpoint_loads_in_one_process_and_another_layout(world8, tmp_path, saved, loaded):
    """A checkpoint of one layout (FSDP over 4 dp ranks on each of 2 stages, FSDP over 3-D blocks among them) loads
    into one process and into another layout (pp2 x tp2), each rank getting its block of the same full tensors."""
    world8.run(check_save, str(tmp_path), saved)
    cfg = _cfg("transformer_lm", "dp2-pp2-tp2-1d", "1f1b", "adamw", 2)
    torch.manual_seed(1)
    plain = build(cfg, V).double()
    init = {n: p.detach().clone() for n, p in plain.named_parameters()}
    load_weights(tmp_path / "step-00000002", plain, {"model": {}})  # DCP assembles the stages' shards
    full = dict(plain.named_parameters())
    assert all(float((full[n] - init[n]).abs().max()) > 0 for n in ("tok_emb.weight", "head.weight"))
    held = set()
    for params, where in world8.run(check_load, str(tmp_path), loaded):
        grid = Grid(where[0])
        grid.coords = where[1]
        held |= set(params)  # (a pipelined layout's rank holds its stage's)
        for n, (p, split) in params.items():
            assert torch.equal(p, grid.local(full[n].detach(), split)), n
    assert held == set(full)


@pytest.mark.parametrize("extra", [[], ["--dp-shard", "2", "--model.softmax", "sampled", "--model.num_sampled", "16",
                                         "--sparse", "ps"]], ids=["replicated", "sharded-ps-sampled"])
def test_composed_resume_is_bit_identical(world8, tmp_path, extra):
    """dp2 x pp2 x tp2 as ``tessel train`` runs it: 6 steps == the step-3 checkpoint resumed for 3 more; also with
    each stage's tensor-parallel blocks sharded over its 2 dp ranks (FSDP), the tables and the sampled softmax
    served by ps: the checkpoint holds whole blocks, so it is read whole here as from any layout."""
    from test_cli import _resumed_equals_uninterrupted

    args = ["--model.dim", "16", "--model.layers", "2", "--model.heads", "2", "--vocab", "64", "--seq-len", "8",
            "--batch", "8", "--metrics.progress", "log", "--dp", "2", "--pp", "2", "--tp", "2", "--tp-mode", "1d",
            "--micro-batches", "2", "--optimizer", "adamw", "--steps", "6", "--pipeline.split", "2,2",
            "--nproc", "8", *extra]
    a, before, full, _ = _resumed_equals_uninterrupted(tmp_path, args, world8)
    assert {n for n, w in a["model"].items() if not torch.equal(before["model"][n], w)} == set(a["model"])
    assert a["model"]["tok_emb.weight"].shape == (64, 16)  # whole, not a rank's block or chunk
    # every rank's tensors at their peak in one step, and the plan's prediction for its stage, in the summary
    summary = json.loads((full / "summary.json").read_text())
    assert all(m > 0 for m in summary["step_peak_mem_per_rank"]) and len(summary["step_peak_mem_per_rank"]) == 8
    assert all(p > 0 for p in summary["predicted_mem_per_rank"])


@pytest.mark.parametrize("extra,message", [
    (["parallel.tp=2", "model.name=lstm_lm"], "not lstm_lm"),
    (["parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1", "sparse.strategy=alltoall"], "only the 1-D vocabulary"),
    (["parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1", "model.softmax=sampled", "model.num_sampled=8"],
     "softmax=sampled with tp-mode 3d"),
    (["parallel.pp=2", "train.micro_batches=2", "pipeline.schedule=torch-1f1b", "sparse.tables=tok_emb=ps"],
     "run a stage's forwards and backwards inside torch"),
])
def test_remaining_refusals_are_one_line(extra, message):
    cfg = load_config(None, [*MODELS["transformer_lm"], *extra])
    with pytest.raises(PlanError, match=message) as e:
        check_before_workers(cfg)
    assert "\n" not in str(e.value)


def test_plan_round_trips_and_prints():
    cfg = load_config(None, [*MODELS["transformer_lm"], *LAYOUTS["pp2-tp4-3d"], "pipeline.schedule=async-predict",
                             "train.optimizer=sgd"])
    plan = planned(cfg, 8)[0].with_(bounds=((0, 2), (2, 4)))
    assert ParallelPlan.from_json(plan.to_json()) == plan
    assert plan.mesh_axes == (("tp_x", 2), ("tp_y", 2), ("tp_z", 1))
    text = plan.describe()
    assert "tensor 3d 2x2x1" in text and "async-predict" in text and "stages 0-1 | 2-3" in text
    with pytest.raises(PlanError, match="not a parallel plan"):
        ParallelPlan.from_dict({"dp": 1, "nonsense": 2})
    assert GridSpec("3d", plan.tp_grid).size == 4


@pytest.mark.parametrize("args,fragment", [
    (["--tp", "2", "--model", "lstm_lm"], "not lstm_lm"),
    (["--pp", "2", "--pipeline.schedule", "torch-1f1b", "--micro-batches", "2", "--sparse", "ps"], "inside torch"),
    (["--tp", "4", "--tp-mode", "2d", "--sparse", "ps"], "only the 1-D vocabulary shard"),
    (["--pp", "2", "--tp", "4", "--tp-mode", "1d", "--model.heads", "2"], "2 attention heads do not split"),
    (["--pp", "8", "--tp", "1"], "pp=8 stages but the model has only 4 pipeline layers"),
])
def test_composed_refusals_through_the_cli(capsys, args, fragment):
    """One line and exit 2 from the launcher, before any worker starts."""
    from test_cli import one_line_error

    one_line_error(capsys, ["train", "--model.layers", "2", *args], fragment)
