"""Sharded data parallelism (FSDP2 over the dp ranks, ``parallel.dp_shard``) equals single-process training.

fp64, several steps, micro-batches, clipping and AdamW: the global loss and gradient norm every step, the first
step's gradients and the parameters after the last must agree with a plain torch loop to 1e-10 (the reference
is tests/steps.py's ``TorchReference``). The bytes of FSDP's gathers and reduce-scatters, which go through
tessel.comm, are checked against a formula written here; each rank holds 1/dp of the weights and their state.
"""

import json
import math
import shutil

import pytest
import torch
import torch.distributed as dist

from composed import planned
from steps import TorchReference, step_side_by_side
from tessel import comm, sparse
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.fsdp import whole
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.plan import ParallelPlan
from tessel.train import checkpoint
from tessel.train.build import build, build_data
from tessel.train.memory import model_state_bytes
from test_cli import TINY, _load, _resumed_equals_uninterrupted
from trained import train

ATOL = 1e-10
LM = ["model.name=transformer_lm", "model.dim=16", "model.layers=2", "model.heads=2", "data.vocab_size=64",
      "data.seq_len=8"]
# the units FSDP shards one by one: the modules the Transformer's chain layers own that hold parameters
UNITS = ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "ln_f", "head"]
SERVED = {"dense": set(), "ps": {"tok_emb"}}  # tables served by rows instead (pos_emb: every row, every step)


def padded(shape: torch.Size, p: int) -> int:
    """Elements of a weight in FSDP's flat buffers: dim 0 padded up to a multiple of the dp ranks."""
    return math.ceil(shape[0] / p) * p * math.prod(shape[1:])


def check_fsdp(extra: list[str], steps: int = 3, shard: int = 0):
    """``shard``: dp ranks per shard group (0: all, FSDP); below the world, HSDP with p / shard replicas."""
    p = dist.get_world_size()
    cfg = load_config(None, [*LM, "train.dtype=float64", "train.global_batch=8", "train.micro_batches=2",
                             "train.optimizer=adamw", "train.weight_decay=0.1", "train.lr=0.05", "train.warmup=2",
                             "train.clip=0.5", f"train.steps={steps}", f"parallel.dp_shard={shard}", *extra])
    plan, settings = planned(cfg)
    s, r = shard or p, p // (shard or p)  # ranks per shard group, replicas of each shard
    assert plan.dp_shard == s and plan.dp_replicate == r
    mesh = build_mesh(plan.dims, timeout=20)
    data = build_data(cfg)
    torch.manual_seed(1)
    ref = build(cfg, 64).double()
    torch.manual_seed(1)
    model = build(cfg, 64).double()
    loader, ref_loader = ShardedLoader(data, 8, dist.get_rank(), p), ShardedLoader(data, 8, 0, 1)
    par = parallelize(model, plan, mesh, [loader.peek()], settings)
    # the ranks sharing out each weight (not the parameters' device_mesh: in a world that re-made its groups,
    # DTensor's cached sharding specs hand back an equal mesh of the task before, whose groups are gone)
    group = par.engine.tail.shard_group
    assert dist.get_world_size(group) == s
    served = {t.name for t in par.plan.tables if t.strategy.served}
    assert served == SERVED[cfg.sparse.strategy], par.plan.tables
    replicated = sum(t.numel() * 8 for n, t in ref.named_parameters() if n.rsplit(".", 1)[0] not in served)

    if not served:  # one forward and backward: the gradients, gathered whole, equal the single process's
        (x, y), (rx, ry) = loader.peek(), ref_loader.peek()
        par.engine.model(x, y).backward()
        ref(rx, ry).backward()
        for n, b in ref.named_parameters():
            torch.testing.assert_close(whole(par.module.get_parameter(n).grad, group), b.grad, rtol=0, atol=ATOL,
                                       msg=n)
        par.optimizer.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)

    comm.counter.end_step()  # the set-up's broadcast is no step's
    ref_engine = TorchReference(ref, cfg.train)
    step_side_by_side(par.engine, ref_engine, loader, ref_loader, 1, p, ATOL)
    sent = {c: v["sent"] for c, v in comm.counter.end_step().items()}
    step_side_by_side(par.engine, ref_engine, loader, ref_loader, steps - 1, p, ATOL)
    full = {n: whole(t.detach(), group) for n, t in par.module.named_parameters()}
    full.update({f"{n}.weight": sparse.full_table(t) for n, t in (par.tables.tables.items() if par.tables else ())})
    for n, b in ref.named_parameters():
        torch.testing.assert_close(full[n], b, rtol=0, atol=ATOL, msg=n)
    torch.manual_seed(1)
    init = build(cfg, 64).double()
    assert max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), init.parameters())) > 1e-3

    # bytes of one step: each unit gathered before its forward and again before its backward, per micro-batch;
    # its gradients reduce-scattered once, after the last micro-batch, within the shard group of s ranks; under
    # HSDP each unit's gradient shard then all-reduced over its r replicas (a ring: 2 (r - 1) / r of it)
    sizes = {u: sum(padded(t.shape, s) for t in ref.get_submodule(u).parameters()) for u in UNITS if u not in served}
    gathered = 2 * 2 * sum(sizes.values()) // s * (s - 1) * 8
    scattered = sum(sizes.values()) // s * (s - 1) * 8
    summed = sum(2 * (r - 1) * (n // s * 8) // r for n in sizes.values())
    assert sent.get("dp.gather") == gathered and sent.get("dp.scatter") == scattered, sent
    assert sent.get("dp.replicate", 0) == summed and (summed > 0) == (r > 1), sent
    assert "dp.dense" not in sent
    # each rank keeps its shard of the weights and of the optimizer's state (a step count is a scalar)
    held = model_state_bytes(par.module.parameters(), par.optimizer)
    return held, replicated, sum(sizes.values()) * 8 // s


# ps rows under Adagrad without decay: its row mirror is exactly torch's dense Adagrad (lazy AdamW rows, or decay of
# untouched rows, would not be)
PS = ["sparse.strategy=ps", "train.optimizer=adagrad", "train.weight_decay=0"]


@pytest.mark.parametrize("extra,states", [(["sparse.strategy=dense"], 2), (PS, 1)], ids=["dense-adamw", "ps-adagrad"])
def test_fsdp_equals_one_process(world2, extra, states):
    for held, replicated, shard in world2.run(check_fsdp, extra):
        # the weights and each state tensor: this rank's half of the padded flat buffers, against whole copies
        assert held == shard * (1 + states) and shard < replicated


@pytest.mark.parametrize("shard,extra,states", [(2, ["sparse.strategy=dense"], 2), (2, PS, 1), (4, PS, 1)],
                         ids=["hsdp2x2-dense-adamw", "hsdp2x2-ps-adagrad", "fsdp4-ps-adagrad"])
def test_fsdp_and_hsdp_on_four_ranks_equal_one_process(world4, shard, extra, states):
    """HSDP 2 x 2 (two replicas of a 2-way shard; the replicas' sum through FSDP's all-reduce hook, counted as
    ``dp.replicate``) and FSDP over all 4 ranks, each against the plain torch loop."""
    for held, replicated, part in world4.run(check_fsdp, extra, 3, shard):
        assert held == part * (1 + states) and part < replicated


def _loads_whole(path, saved: dict) -> None:
    """The sharded checkpoint at ``path`` loads into a plain one-process model (TINY's shape) as ``saved``."""
    cfg = load_config(None, ["model.dim=16", "model.layers=1", "model.heads=2", "data.vocab_size=200",
                             "data.seq_len=8"])
    plain = build(cfg, 200)
    checkpoint.load_weights(path, plain, {"model": checkpoint.read_meta(path)["model"]})
    for n, w in plain.named_parameters():
        assert torch.equal(w.detach(), saved["model"][n]), n


def test_sharded_run_resumes_bit_identical_and_its_checkpoint_loads_whole(world2, tmp_path):
    """``tessel train --dp-shard 2`` as its workers run it: 6 steps == the step-3 checkpoint resumed for 3 more (DCP
    saves each rank's shards and AdamW's sharded state); the checkpoint loads into a plain one-process model;
    the summary counts FSDP's channels, not DDP's."""
    args = [*TINY, "--dp-shard", "2", "--optimizer", "adamw", "--steps", "6", "--sparse", "dense"]
    saved, before, full, part = _resumed_equals_uninterrupted(tmp_path, args, world2)
    assert not torch.equal(before["model"]["head.weight"], saved["model"]["head.weight"])
    # the same sharded checkpoint resumed under DDP (dp_shard 1): DCP gathers the shards; fp32 sums in another order
    replicated = tmp_path / "replicated"
    shutil.copytree(part / "checkpoints" / "step-00000003", replicated / "checkpoints" / "step-00000003")
    train(world2, tmp_path, *TINY, "--optimizer", "adamw", "--steps", "6", "--sparse", "dense", "--resume", "--out",
          str(replicated))
    ddp = _load(replicated / "checkpoints" / "step-00000006", tmp_path)
    for n, w in saved["model"].items():
        torch.testing.assert_close(ddp["model"][n], w, rtol=0, atol=1e-6, msg=n)
    summary = json.loads((full / "summary.json").read_text())
    assert "weights sharded over 2 dp ranks (FSDP)" in ParallelPlan.from_dict(summary["plan"]).describe()
    assert {"dp.gather", "dp.scatter"} <= set(summary["bytes"]) and "dp.dense" not in summary["bytes"]
    _loads_whole(full / "checkpoints" / "step-00000006", saved)


def test_hsdp_run_resumes_bit_identical_and_its_checkpoint_loads_whole(world4, tmp_path):
    """``tessel train --nproc 4 --dp-shard 2`` (HSDP: two replicas of a 2-way shard, ps tables): 6 steps == the
    step-3 checkpoint resumed for 3 more (DCP saves each shard once though two ranks hold it); the checkpoint
    loads into a plain one-process model; the summary counts the replicas' channel."""
    args = [*TINY, "--nproc", "4", "--dp-shard", "2", "--optimizer", "adamw", "--steps", "6", "--sparse", "ps"]
    saved, before, full, _ = _resumed_equals_uninterrupted(tmp_path, args, world4)
    assert not torch.equal(before["model"]["head.weight"], saved["model"]["head.weight"])
    summary = json.loads((full / "summary.json").read_text())
    assert "weights sharded over 2 dp ranks, 2 replicas (HSDP)" in ParallelPlan.from_dict(summary["plan"]).describe()
    assert {"dp.gather", "dp.scatter", "dp.replicate"} <= set(summary["bytes"])
    _loads_whole(full / "checkpoints" / "step-00000006", saved)


def gather_bytes(precision: str) -> tuple[dict, float]:
    cfg = load_config(None, [*LM, "train.global_batch=8", f"train.precision={precision}", "sparse.strategy=dense",
                             "parallel.dp_shard=0"])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, timeout=20)
    loader = ShardedLoader(build_data(cfg), 8, dist.get_rank(), dist.get_world_size())
    torch.manual_seed(1)
    par = parallelize(build(cfg, 64), plan, mesh, [loader.peek()], settings)
    comm.counter.end_step()
    x, y = loader.next_batch()
    loss = par.engine.step(x, y, 0).loss
    assert all(p.dtype == torch.float32 for p in par.module.parameters())  # fp32 masters, sharded
    return {c: v["sent"] for c, v in comm.counter.end_step().items()}, loss


def test_bf16_mixed_gathers_half_the_bytes_and_reduces_in_fp32(world2):
    (fp32, loss32), _ = world2.run(gather_bytes, "fp32")
    (bf16, loss16), _ = world2.run(gather_bytes, "bf16-mixed")
    assert bf16["dp.gather"] * 2 == fp32["dp.gather"] > 0  # the weights cross in bf16
    assert bf16["dp.scatter"] == fp32["dp.scatter"] > 0  # gradients summed in fp32 (gloo has no bf16 sum)
    assert loss16 != loss32 and abs(loss16 - loss32) < 0.05 * loss32  # rounded, not another run


def _one_unit_step() -> list[float]:
    """A model with no registered chain under FSDP: the root is its one unit. A step's gradients, gathered whole."""
    from torch import nn

    from tessel.fsdp import apply_fsdp
    from tessel.mesh import ParallelDims

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    m = build_mesh(ParallelDims(dp=2, pp=1, tp=1, world_size=2), 20)
    model = apply_fsdp(model, m["dp"], [])
    model(torch.ones(3, 4, dtype=torch.float64)).sum().backward()
    return [float(whole(p.grad, m.get_group("dp")).abs().sum()) for p in model.parameters()]


def test_a_model_with_no_chain_is_one_fsdp_unit(world2):
    """FSDP over a model the chain registry does not know shards the root as one unit: a step runs and every rank
    holds the same gradients."""
    first, second = world2.run(_one_unit_step)
    assert first == second and len(first) == 4 and all(g > 0 for g in first)
