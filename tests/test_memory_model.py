"""The planner's peak memory per rank against the peak measured in a real step, layout by layout.

Measured: the most bytes of tensor storage alive at once during a rank's second step (``PeakTensors``: the
weights, gradients, optimizer state and served tables held at entry, and every storage an operation makes until
it is freed; what ``torch.cuda.max_memory_allocated`` counts on a GPU). Predicted: ``stage_memory`` on the plain
model's layers measured at the run's micro-batch (``measure_memory``), as ``tessel train`` prints it, with the
tables' rows as the run surveyed them; and, where the stage cut is known before the workers start, as the
launcher's check predicts it (``predicted_memory`` with no survey: it decides and measures the tables itself).
Nothing is timed. The goal is 10% on every layout here; each error is printed so the docs can quote them.
"""

import pytest
import torch
import torch.distributed as dist

from composed import planned
from tessel import comm
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.planner.memory import stage_memory
from tessel.planner.profile import measure_memory
from tessel.preflight import predicted_memory
from tessel.resolve import job_of
from tessel.sparse.served import table_use
from tessel.train.build import build, build_data
from tessel.train.memory import PeakTensors, held_tensors

LM = ["model.name=transformer_lm", "model.dim=64", "model.layers=2", "model.heads=4", "data.vocab_size=1024",
      "data.seq_len=32", "train.global_batch=16", "train.optimizer=adamw"]
LAYOUTS = {  # name -> config keys, on 4 ranks
    "ddp4": ["sparse.strategy=dense"],
    # the token table tied to the head: one weight, its gradient and state once (predicted 24% over while each
    # layer that uses it counted it)
    "ddp4-tied": ["model.tie_embeddings=true", "sparse.strategy=dense"],
    "fsdp4": ["parallel.dp_shard=0", "sparse.strategy=dense"],
    "hsdp2x2-ps": ["parallel.dp_shard=2", "sparse.strategy=ps", "train.optimizer=adagrad"],
    "fsdp4-recompute": ["parallel.dp_shard=0", "train.recompute=layers", "sparse.strategy=dense"],
    "ddp4-selective": ["train.recompute=selective", "sparse.strategy=dense"],
    # (a pipeline's cut is given: the planner's own cut follows the layers' timing, and each cut peaks elsewhere)
    "pp2-fsdp2-1f1b-m2": ["parallel.pp=2", "pipeline.split=2,2", "parallel.dp_shard=0", "train.micro_batches=2",
                          "sparse.strategy=dense"],
    "pp2-dp2-gpipe-m4": ["parallel.pp=2", "pipeline.split=2,2", "pipeline.schedule=gpipe", "train.micro_batches=4",
                         "sparse.strategy=dense"],
    # the fused head alone on the last stage: the peak is a forward's (the logits made and dropped there, the
    # earlier micro-batches' weight gradients kept), no gradient yet (predicted 11% over while the profile put
    # the forward's transient in the backward, beside the gradients)
    "pp2-dp2-gpipe-m4-head": ["parallel.pp=2", "pipeline.split=3,1", "pipeline.schedule=gpipe",
                              "train.micro_batches=4", "sparse.strategy=dense"],
    "tp2-1d-fsdp2": ["parallel.tp=2", "tensor.mode=1d", "parallel.dp_shard=0", "sparse.strategy=dense"],
}
# at width 256 the blocks outweigh the head, and what tensor parallelism leaves whole or gathers shows: a 1-D
# layer's norms and residual (whole on every rank), a 3-D layer's gathered weight blocks (kept for backward)
# and FSDP's unit gradients and their reduce-scatter copy (predicted 13-32% short before they were counted)
WIDE = ["model.dim=256", "model.layers=4", "model.heads=8", "data.vocab_size=512"]
LAYOUTS |= {
    "w256-fsdp4": [*WIDE, "parallel.dp_shard=0", "sparse.strategy=dense"],
    "w256-tp4-1d": [*WIDE, "parallel.tp=4", "tensor.mode=1d", "sparse.strategy=dense"],
    "w256-tp4-3d-2x1x2": [*WIDE, "parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x1x2", "sparse.strategy=dense"],
    "w256-pp2-tp2-1d-m4": [*WIDE, "parallel.pp=2", "pipeline.split=3,3", "parallel.tp=2", "tensor.mode=1d",
                           "train.micro_batches=4", "sparse.strategy=dense"],
    # a vocabulary 64x the width, as in the default model: the peak is in the head and its vocabulary-parallel loss
    # (3-D: the head's forward, where its partial logits are reduce-scattered; predicted 15% short while the
    # profile subtracted the last layer's logits as if they were the stand-in loss's)
    "v4096-tp4-3d-2x2x1": ["data.vocab_size=4096", "parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1",
                           "sparse.strategy=dense"],
    "v4096-tp4-2d": ["data.vocab_size=4096", "parallel.tp=4", "tensor.mode=2d", "sparse.strategy=dense"],
    # the rest of issue 38's layouts: sharding under GPipe, an all-to-all table beside FSDP
    "pp2-fsdp2-gpipe-m4": ["parallel.pp=2", "pipeline.split=2,2", "parallel.dp_shard=0", "pipeline.schedule=gpipe",
                           "train.micro_batches=4", "sparse.strategy=dense"],
    # the token table alone on the first stage: fed ids, its unit is reduce-scattered by FSDP's final callback,
    # the whole gradient, the copy sent and the copy received at once (predicted 27% short without them)
    "pp2-fsdp2-gpipe-m4-embed": ["parallel.pp=2", "pipeline.split=1,3", "parallel.dp_shard=0",
                                 "pipeline.schedule=gpipe", "train.micro_batches=4", "sparse.strategy=dense"],
    "fsdp4-alltoall": ["parallel.dp_shard=0", "sparse.strategy=alltoall", "train.optimizer=adagrad"],
}
# bf16-mixed: autocast keeps fp32 tensors (norm inputs, the residual stream, the fused loss's blocks) beside bf16
# ones and the weights' bf16 copies the products save, so a layer's memory is measured under the run's autocast
# (predicted 20-25% short here, and 31-49% on the default model, while the fp32 profile's activations were
# halved for bf16)
BF16 = "train.precision=bf16-mixed"
LAYOUTS |= {
    "ddp4-bf16": [BF16, "sparse.strategy=dense"],
    "fsdp4-bf16": [BF16, "parallel.dp_shard=0", "sparse.strategy=dense"],
    "ddp4-recompute-bf16": [BF16, "train.recompute=layers", "sparse.strategy=dense"],
    "fsdp4-recompute-bf16": [BF16, "parallel.dp_shard=0", "train.recompute=layers", "sparse.strategy=dense"],
    "pp2-dp2-gpipe-m4-bf16": [BF16, "parallel.pp=2", "pipeline.split=2,2", "pipeline.schedule=gpipe",
                              "train.micro_batches=4", "sparse.strategy=dense"],
    "w256-fsdp4-bf16": [*WIDE, BF16, "parallel.dp_shard=0", "sparse.strategy=dense"],
    "w256-tp4-1d-bf16": [*WIDE, BF16, "parallel.tp=4", "tensor.mode=1d", "sparse.strategy=dense"],
    "w256-tp4-3d-2x1x2-bf16": [*WIDE, BF16, "parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x1x2",
                               "sparse.strategy=dense"],
}
# the sparse LSTM, whose tables (input embedding, sampled softmax) are most of the model: before the launcher's
# check decided and measured the tables it priced them as dense weights, 4x the measured peak; the all-to-all
# head is column-split but not fed from the batch, so it fetches nothing ahead
LSTM = ["model.name=lstm_lm", "model.dim=32", "model.hidden=48", "model.softmax=sampled", "model.num_sampled=64",
        "data.vocab_size=8192", "data.seq_len=16", "train.optimizer=adagrad"]
LAYOUTS |= {"lstm-ps": [*LSTM, "sparse.strategy=ps"], "lstm-alltoall": [*LSTM, "sparse.strategy=alltoall"]}
# on 8 ranks: sharding beside 3-D tensor parallelism, and beside pipeline and tensor parallelism with a ps table
LAYOUTS8 = {
    "fsdp2-tp4-3d-2x2x1": ["parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1", "parallel.dp_shard=0",
                           "sparse.strategy=dense"],
    "fsdp2-pp2-tp2-ps": ["parallel.pp=2", "pipeline.split=2,2", "parallel.tp=2", "tensor.mode=1d",
                         "parallel.dp_shard=0", "train.micro_batches=2", "sparse.strategy=ps",
                         "train.optimizer=adagrad"],
    "fsdp2-pp2-tp2-ps-sampled": ["parallel.pp=2", "pipeline.split=2,2", "parallel.tp=2", "tensor.mode=1d",
                                 "parallel.dp_shard=0", "train.micro_batches=2", "sparse.strategy=ps",
                                 "train.optimizer=adagrad", "model.softmax=sampled"],
}


def measured_and_predicted(keys: list[str]) -> tuple[int, float, float | None]:
    """(Measured peak, the run's prediction, the launcher's prediction or None where it makes none) on this rank."""
    cfg = load_config(None, [*LM, *keys])
    plan, settings = planned(cfg)
    data = build_data(cfg)
    before = None
    if dist.get_rank() == 0 and (plan.pp == 1 or plan.bounds):  # (what preflight checks a memory limit against)
        before = predicted_memory(cfg, plan, data)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    batch = cfg.train.global_batch
    loader = ShardedLoader(data, batch, mesh.get_local_rank("dp"), plan.dp)
    torch.manual_seed(1)
    par = parallelize(build(cfg, data.vocab_size), plan, mesh, [loader.peek()], settings)
    for step in range(2):
        x, y = loader.next_batch()
        held = [*held_tensors(par.module, par.optimizer), *(par.tables.held_tensors() if par.tables else ())]
        with PeakTensors(held) as peak:
            par.engine.step(x, y, step)
    predicted = None
    use = table_use(par.tables)  # every stage's tables' survey
    if dist.get_rank() == 0:  # (as a run does: once, for every stage)
        profile = measure_memory(job_of(cfg, data), batch // (plan.dp * plan.micro_batches))
        predicted = stage_memory(par.plan, settings, profile, use)
    predicted, before = comm.all_gather_object((predicted, before), "meta")[0]
    k = mesh.get_local_rank("pp")
    return peak.bytes, predicted[k], before[k] if before else None


@pytest.mark.parametrize("layout", [*LAYOUTS, *LAYOUTS8])
def test_predicted_peak_within_ten_percent_of_measured(request, layout):
    size, keys = (4, LAYOUTS[layout]) if layout in LAYOUTS else (8, LAYOUTS8[layout])
    world = request.getfixturevalue(f"world{size}")
    runs = world.run(measured_and_predicted, keys)
    if any(m > 1.1 * p for m, p, _ in runs):
        # gloo's worker thread drops its reference to a collective's tensors a moment after the caller's wait
        # returns; now and then it is descheduled in that moment, and a buffer FSDP has let go (a unit's all-gather
        # output) outlives the allocations after it: 2 of 80 second-step peaks of pp2-fsdp2-gpipe-m4-embed came out
        # 256 KiB over the other 78 (2026-12-01). That race only adds, so where a rank measured over the prediction,
        # the same step is measured once more and each rank's lower peak is its own.
        again = world.run(measured_and_predicted, keys)
        runs = [(min(m, m2), p, b) for (m, p, b), (m2, _, _) in zip(runs, again)]
    for rank, (measured, predicted, before) in enumerate(runs):
        error = (predicted - measured) / measured
        ahead = "" if before is None else f", before workers {before / 2**20:.2f} MiB ({before / measured - 1:+.1%})"
        print(f"{layout} rank {rank}: measured {measured / 2**20:.2f} MiB, predicted {predicted / 2**20:.2f} MiB "
              f"({error:+.1%}){ahead}")
        assert abs(error) < 0.10, (layout, rank, measured, predicted)
        assert before is None or abs(before / measured - 1) < 0.10, (layout, rank, measured, before)


def test_plan_over_the_memory_per_rank_is_refused_before_any_worker_starts(capsys):
    """``plan.memory_gib`` under the plan's predicted peak: one line naming the need, the limit and what fits
    instead, exit code 2, from the launching process (the cut of a given split is known before the workers)."""
    from tessel.cli import main

    tiny = ["--model.dim", "16", "--model.layers", "2", "--model.heads", "2", "--vocab", "200", "--seq-len", "8",
            "--batch", "8", "--nproc", "2"]
    assert main(["train", *tiny, "--pp", "2", "--pipeline.split", "2,2", "--plan.memory_gib", "0.0001"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fullest rank (predicted), over plan.memory_gib=0.0001" in err, err
    assert "--dp-shard" in err and "recompute" in err


def test_memory_only_profile_measures_each_kind_of_layer_once():
    """A memory-only profile (no timing) measures a kind of layer once and gives its numbers to the equal layers
    after it; each layer measured on its own gives the same numbers."""
    from tessel.chain import chain_of
    from tessel.pipeline.partition import profile

    cfg = load_config(None, [*LM, "model.layers=3"])
    job = job_of(cfg)
    with torch.device("meta"):
        model = job.build()
    x, y = job.batch(4, 1)
    chain = chain_of(model)
    once = profile(model, chain, x, y, repeats=0, memory=True)
    each = profile(model, chain, x, y, repeats=1, memory=True)
    assert [(c.name, c.saved, c.work, c.ahead) for c in once] == [(c.name, c.saved, c.work, c.ahead) for c in each]
    assert len({(c.saved, c.work, c.ahead) for c in once[1:-1]}) == 1 and once[1].saved > 0
    # the fused head makes and drops its logits in the forward (its weight's gradient, made there too, is saved):
    # that transient is the forward's, where no gradient exists yet under GPipe, not the backward's
    head, logits = once[-1], 4 * 32 * 1024 * 4  # (samples, seq_len, vocabulary) in fp32
    assert head.ahead >= logits / 2 and head.work < head.ahead / 4, (head.ahead, head.work)
