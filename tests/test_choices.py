"""Choices are records: a new schedule or table strategy that behaves like an existing one is one entry, and a run
follows a plan file exactly, whatever its config says.

- A copy of 1f1b registered under another name (in the test only) trains a pipeline step for step like 1f1b;
  a copy of ps does the same for a table, moving its rows on the ps channels.
- ``tessel train --plan FILE`` with flags that contradict every field of the file runs as the file says: the
  printed plan, the plan in the summary, and the channels the bytes were counted on.
"""

import dataclasses
import json

import torch

from composed import planned
from tessel import choices, comm
from tessel.choices import schedule, table_strategy
from tessel.cli import main
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.plan import ParallelPlan, TablePolicy
from tessel.train.build import build, build_data
from trained import train

TRANSFORMER = ["model.name=transformer_lm", "model.dim=16", "model.layers=2", "model.heads=2", "data.vocab_size=64",
               "data.seq_len=8", "train.global_batch=8", "train.dtype=float64", "train.optimizer=sgd", "train.lr=0.05",
               "train.momentum=0", "train.warmup=1", "train.clip=0.5", "sparse.max_touched=1.0"]


def _train(overrides: list[str], steps: int = 3) -> tuple[list[float], dict, list[tuple], dict]:
    """(losses, parameters after ``steps``, the plan's tables, bytes per channel over the steps) of the composed
    Transformer LM on this world."""
    cfg = load_config(None, [*TRANSFORMER, *overrides])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    model = build(cfg, data.vocab_size).double()
    dp = mesh.get_local_rank("dp")
    peek = ShardedLoader(data, 8, dp, plan.dp)
    par = parallelize(model, plan, mesh, [peek.next_batch(), peek.next_batch()], settings)
    loader, losses = ShardedLoader(data, 8, dp, plan.dp), []
    comm.counter.end_step()
    for step in range(steps):
        x, y = loader.next_batch()
        losses.append(par.engine.step(x, y, step, loader.peek()).loss)
    sent = {c: v["sent"] for c, v in comm.counter.end_step().items()}
    params = {n: p.detach().clone() for n, p in par.module.named_parameters()}
    return losses, params, [(t.name, t.strategy.name, t.split) for t in par.plan.tables], sent


def run_with_copies(overrides: list[str], copy: list[str]):
    """Register a copy of 1f1b and of ps under other names in this process only, train once with the original
    choices and once with the copies; the records are removed again."""
    made = [choices.register(dataclasses.replace(schedule("1f1b"), name="test-1f1b", planned=False)),
            choices.register(dataclasses.replace(table_strategy("ps"), name="test-ps"))]
    try:
        return _train(overrides), _train([*overrides, *copy])
    finally:
        for r in made:
            choices.unregister(r)


def _same(a, b) -> None:
    assert a[0] == b[0]  # losses, bit for bit
    for n, p in a[1].items():
        assert torch.equal(p, b[1][n]), n


def test_a_schedule_record_copied_under_another_name_trains_as_the_original(world2):
    for original, copied in world2.run(run_with_copies, ["parallel.pp=2", "pipeline.split=2,2",
                                                         "train.micro_batches=2", "sparse.strategy=dense"],
                                       ["pipeline.schedule=test-1f1b"]):
        _same(original, copied)
        assert copied[3]["pp"] == original[3]["pp"] > 0


def test_a_table_strategy_record_copied_under_another_name_serves_as_the_original(world2):
    for original, copied in world2.run(run_with_copies, ["sparse.strategy=ps"], ["sparse.strategy=test-ps"]):
        _same(original, copied)
        assert [t[1] for t in original[2]] == ["ps", "ps"] and [t[1] for t in copied[2]] == ["test-ps", "test-ps"]
        # the copy builds ps tables: its rows move on the same channels, byte for byte
        assert {c: v for c, v in copied[3].items() if c.startswith("ps.")} == \
            {c: v for c, v in original[3].items() if c.startswith("ps.")} and copied[3]["ps.pull"] > 0


def test_a_run_follows_its_plan_file_whatever_the_config_says(world4, tmp_path):
    """A plan written by ``tessel plan --json`` (its layout then set to one that every flag below contradicts,
    through the same writer) runs as the file says: dp2 x pp2, gpipe at 2 micro-batches, the stage cut 1 | 3, the
    token table served by alltoall split by rows, tessel's own DDP hook, gradients averaged in bf16."""
    model = ["--model", "transformer_lm", "--model.dim", "16", "--model.layers", "2", "--model.heads", "2",
             "--data.vocab_size", "256", "--data.seq_len", "8", "--batch", "8"]
    written = tmp_path / "plan.json"
    assert main(["plan", *model, "--nproc", "4", "--json", str(written)]) == 0
    plan = ParallelPlan.from_json(written.read_text()).with_(
        dp=2, pp=2, tp=1, tp_mode="1d", tp_grid=(1,), schedule="gpipe", micro_batches=2, bounds=((0, 1), (1, 4)),
        sparse=TablePolicy(strategy="alltoall", split="row", max_touched=1.0), ddp_hook=True, grad_reduce="bf16",
        tables=())
    written.write_text(plan.to_json())
    contrary = ["--dp", "4", "--pp", "1", "--tp", "1", "--pipeline.schedule", "1f1b", "--pipeline.split", "2,2",
                "--micro-batches", "1", "--sparse", "dense", "--sparse.split", "column", "--parallel.ddp_comm", "torch",
                "--tensor.regather", "true", "--parallel.grad_reduce", "full", "--nproc", "4"]
    _, out = train(world4, tmp_path, *model, *contrary, "--plan", str(written), "--steps", "3",
                   "--checkpoint.enabled", "false", "--metrics.progress", "log", "--metrics.heldout", "false", "--out",
                   str(tmp_path / "run"))
    printed = next(line for line in out.splitlines() if line.startswith("plan: "))
    assert printed.startswith("plan: dp=2, pp=2, tp=1, schedule gpipe, stages 0-0 | 1-3, 2 micro-batches, tables "
                              "tok_emb=alltoall/row"), printed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    ran = ParallelPlan.from_dict(summary["plan"])
    assert ran.with_(tables=()) == plan
    assert dict((t.name, (t.strategy.name, t.split)) for t in ran.tables)["tok_emb"] == ("alltoall", "row")
    channels = set(summary["bytes"])
    assert {"pp", "a2a.fwd", "a2a.bwd", "dp.dense"} <= channels, channels  # torch's DDP would count no dp.dense
    assert "dp gradients reduced in bf16" in printed, printed
    assert not any(c.startswith("tp") for c in channels)
