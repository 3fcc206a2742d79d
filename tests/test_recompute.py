"""Activation recompute (``train.recompute``): each chain layer keeps only its input (``layers``), or also its
matrix products' outputs (``selective``), and runs its forward again in backward. The math is unchanged: fp64
training with it equals a plain torch loop to 1e-10, and a run with it equals the same run without it, under
dp, FSDP and a flushed pipeline. What the first micro-batch's forward keeps for backward shrinks."""

import json

import pytest
import torch
import torch.distributed as dist

from composed import planned
from steps import TorchReference, step_side_by_side
from tessel import sparse
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.train.build import build, build_data
from test_cli import TINY
from trained import train

ATOL = 1e-10
MODELS = {
    "transformer_lm": ["model.name=transformer_lm", "model.dim=16", "model.layers=2", "model.heads=2",
                       "data.vocab_size=64", "data.seq_len=8"],
    "lstm_lm": ["model.name=lstm_lm", "model.dim=12", "model.hidden=16", "model.softmax=sampled",
                "model.num_sampled=16", "data.vocab_size=64", "data.seq_len=6"],
}


def check_recompute(name: str, recompute: str, extra: list[str], steps: int = 3):
    p = dist.get_world_size()
    cfg = load_config(None, [*MODELS[name], "train.dtype=float64", "train.global_batch=8", "train.micro_batches=2",
                             "train.optimizer=adamw", "train.lr=0.05", "train.warmup=2", "train.clip=0.5",
                             f"train.steps={steps}", "sparse.strategy=dense", f"train.recompute={recompute}", *extra])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, timeout=20)
    data = build_data(cfg)
    torch.manual_seed(1)
    ref = build(cfg, 64).double()
    torch.manual_seed(1)
    loader, ref_loader = ShardedLoader(data, 8, dist.get_rank(), p), ShardedLoader(data, 8, 0, 1)
    par = parallelize(build(cfg, 64).double(), plan, mesh, [loader.peek()], settings)
    step_side_by_side(par.engine, TorchReference(ref, cfg.train), loader, ref_loader, steps, p, ATOL)
    got = {n: t.full_tensor() if hasattr(t, "full_tensor") else t for n, t in par.module.named_parameters()}
    got.update({f"{n}.weight": sparse.full_table(t) for n, t in (par.tables.tables.items() if par.tables else ())})
    for n, b in ref.named_parameters():
        torch.testing.assert_close(got[n], b, rtol=0, atol=ATOL, msg=n)
    return par.engine.activation_bytes


@pytest.mark.parametrize("name", MODELS)
def test_recompute_equals_one_process_and_keeps_less(world2, name):
    kept = {r: world2.run(check_recompute, name, r, [])[0] for r in ("none", "layers", "selective")}
    assert kept["layers"] < kept["none"] and kept["selective"] < kept["none"], kept
    # under FSDP the recomputed forward gathers its layer's weights again, and the math still holds
    world2.run(check_recompute, name, "layers", ["parallel.dp_shard=0"])
    # served tables: a recomputed layer reads the rows its first forward fetched (no second fetch), Adagrad rows
    strategy = "ps" if name == "transformer_lm" else "alltoall"
    world2.run(check_recompute, name, "selective", [f"sparse.strategy={strategy}", "train.optimizer=adagrad"])


def test_recomputed_pipeline_trains_exactly_as_without(world2, tmp_path):
    """pp=2, 1f1b, 2 micro-batches, fp64, dropout on, as ``tessel train`` runs it: every step's loss equals the run
    without recompute's (the recomputed forward draws the same dropout masks)."""
    args = [*TINY, "--model", "transformer_lm", "--model.layers", "2", "--pp", "2", "--micro-batches", "2",
            "--model.dropout", "0.1",
            "--dtype", "float64", "--steps", "4", "--checkpoint.enabled", "false"]
    losses = {}
    for r in ("none", "layers", "selective"):
        out = tmp_path / r
        train(world2, tmp_path, *args, "--train.recompute", r, "--out", str(out))
        losses[r] = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses["none"]) == 4
    for r in ("layers", "selective"):
        assert max(abs(a - b) for a, b in zip(losses[r], losses["none"])) < ATOL, losses
