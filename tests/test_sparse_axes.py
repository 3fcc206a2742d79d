"""Sparse tables on every axis: under pipeline stages and tensor parallelism, equal to single-process training.

The composer's own path (``tessel.parallelize.parallelize``) on 4- and 8-rank gloo worlds, fp64, clipping on,
to 1e-10: the loss of the last stage, the global gradient norm every step, and after the steps every dense
parameter and every served table (gathered over its dp group) against one process training the same global
batch. The sampled softmax draws its candidates once per micro-batch on the last stage, so the reference's
micro-batch i is every dp rank's micro-batch i. Bytes of the table channels are checked against formulas
from the ids the ranks looked up; the asynchronous schedules against the flushed one for convergence.
"""

import copy

import pytest
import torch
import torch.distributed as dist

from composed import planned
from steps import TorchReference
from tessel import comm, sparse
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.train import checkpoint
from tessel.train.build import build, build_data
from tessel.train.checkpoint import load_weights

ATOL = 1e-10
B = 8  # global batch
MODELS = {
    "lstm": ["model.name=lstm_lm", "model.dim=12", "model.hidden=16", "model.softmax=sampled",
             "model.num_sampled=16", "data.vocab_size=80", "data.seq_len=6", "pipeline.split=1,1"],
    "transformer": ["model.name=transformer_lm", "model.dim=16", "model.layers=2", "model.heads=2",
                    "data.vocab_size=64", "data.seq_len=8", "pipeline.split=2,2"],
}
MODELS["transformer-sampled"] = [*MODELS["transformer"], "model.softmax=sampled", "model.num_sampled=16"]
LAYOUTS = {"pp2-dp2": ["parallel.pp=2", "parallel.dp=2"], "tp2-dp2": ["parallel.tp=2", "tensor.mode=1d"],
           "dp2-pp2-tp2": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=1d"]}


def _cfg(model, layout, strategy, schedule, optimizer, micro=2, extra=()):
    return load_config(None, [*MODELS[model], *LAYOUTS[layout], "train.dtype=float64", f"train.global_batch={B}",
                              f"train.micro_batches={micro}", f"train.optimizer={optimizer}", "train.lr=0.05",
                              "train.warmup=1", "train.clip=0.5", "train.momentum=0", f"pipeline.schedule={schedule}",
                              f"sparse.strategy={strategy}", "sparse.max_touched=1.0", *extra])


def _compose(cfg):
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    model = build(cfg, data.vocab_size).double()
    ref = copy.deepcopy(model)
    dp = mesh.get_local_rank("dp")
    peek = ShardedLoader(data, B, dp, plan.dp)
    par = parallelize(model, plan, mesh, [peek.next_batch(), peek.next_batch()], settings)
    return par, ref, ShardedLoader(data, B, dp, plan.dp), mesh


def _regroup(t: torch.Tensor, group, micro: int) -> torch.Tensor:
    """The global batch whose micro-batch i is every dp rank's micro-batch i, in dp order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    chunks = [p.chunk(micro) for p in parts]
    return torch.cat([c[i] for i in range(micro) for c in chunks])


def _rows(par, name: str) -> slice:
    """The rows of the plain table that this rank's table holds (its vocabulary shard under tp)."""
    holder = par.module.get_submodule(name)
    lo = getattr(holder, "lo", 0)
    return slice(lo, lo + sparse.full_table(par.tables.tables[name]).shape[0]) if par.plan.tp > 1 else slice(None)


def check_parity(model, layout, strategy, schedule, optimizer, micro=2, steps=3, extra=()):
    cfg = _cfg(model, layout, strategy, schedule, optimizer, micro, extra)
    par, ref, loader, mesh = _compose(cfg)
    dp_group, last = mesh.get_group("dp"), mesh.get_local_rank("pp") == par.plan.pp - 1
    ref_engine = TorchReference(ref, cfg.train)
    for step in range(steps):
        x, y = loader.next_batch()
        upcoming = loader.peek() if step + 1 < steps else None
        rx, ry = _regroup(x, dp_group, micro), _regroup(y, dp_group, micro)
        rng = torch.get_rng_state()
        res = par.engine.step(x, y, step, upcoming)
        torch.set_rng_state(rng)  # the reference draws the sampled softmax's candidates anew
        ref_res = ref_engine.step(rx, ry, step)
        mean = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(mean, "meta", group=dp_group)
        if last:
            assert abs(float(mean) / par.plan.dp - ref_res.loss) < ATOL, (float(mean), ref_res.loss)
        assert abs(res.grad_norm - ref_res.grad_norm) < ATOL, (step, res.grad_norm, ref_res.grad_norm)
    want = dict(ref.named_parameters())
    for n, p in par.module.named_parameters():
        if n.endswith("k_proj.bias") and optimizer != "sgd":
            continue  # its gradient is rounding noise that adaptive optimizers scale up (see test_sparse)
        full = want[n].detach()
        local = par.shards.grid.local(full, p.tp_split) if par.shards is not None and hasattr(p, "tp_split") else full
        torch.testing.assert_close(p, local, rtol=0, atol=ATOL, msg=n)
    served = {}
    for name, t in (par.tables.tables if par.tables else {}).items():
        got = sparse.full_table(t)
        torch.testing.assert_close(got, want[f"{name}.weight"].detach()[_rows(par, name)], rtol=0, atol=ATOL,
                                   msg=name)
        served[name] = t.strategy
    return served, [(c.name, c.strategy.name) for c in par.plan.tables]


PIPELINED = [("lstm", "ps", "gpipe", "adagrad", ()), ("lstm", "alltoall", "1f1b", "sgd", ()),
             ("lstm", "alltoall", "gpipe", "adagrad", ("sparse.schedule=false",)),
             ("transformer", "ps", "1f1b", "sgd", ()), ("transformer", "alltoall", "gpipe", "adagrad", ())]


@pytest.mark.parametrize("model,strategy,schedule,optimizer,extra", PIPELINED)
def test_tables_under_pipeline_stages_match_single_process(world4, model, strategy, schedule, optimizer, extra):
    out = world4.run(check_parity, model, "pp2-dp2", strategy, schedule, optimizer, extra=extra)
    first = {"lstm": {"embedding": strategy}, "transformer": {"tok_emb": strategy, "pos_emb": strategy}}[model]
    last = {"lstm": {"head.weight": strategy, "head.bias": strategy}, "transformer": {}}[model]
    # ranks 0, 1 hold stage 0 (the input table), ranks 2, 3 stage 1 (the sampled softmax's tables)
    assert [o[0] for o in out] == [first, first, last, last]
    assert dict(out[0][1]) == {**first, **last}  # the plan names every stage's tables


@pytest.mark.parametrize("strategy,optimizer", [("ps", "adagrad"), ("alltoall", "sgd")])
def test_vocabulary_shard_served_under_tensor_parallelism(world4, strategy, optimizer):
    out = world4.run(check_parity, "transformer", "tp2-dp2", strategy, "1f1b", optimizer)
    assert all(o[0] == {"tok_emb": strategy} for o in out)


@pytest.mark.parametrize("strategy,optimizer", [("ps", "adagrad"), ("alltoall", "sgd"), ("dense", "adagrad")])
def test_sampled_head_served_under_tensor_parallelism(world4, strategy, optimizer):
    """1-D tp keeps the last hidden state whole on every rank, so each runs the whole sampled head; its tables
    are served over that rank's dp group beside the vocabulary shard of the token table."""
    out = world4.run(check_parity, "transformer-sampled", "tp2-dp2", strategy, "1f1b", optimizer)
    served = {} if strategy == "dense" else {"tok_emb": strategy, "head.weight": strategy, "head.bias": strategy}
    assert all(o[0] == served for o in out)


def test_sampled_head_under_pp_tp_dp(world8):
    out = world8.run(check_parity, "transformer-sampled", "dp2-pp2-tp2", "alltoall", "gpipe", "adagrad")
    head = {"head.weight": "alltoall", "head.bias": "alltoall"}
    assert [o[0] for o in out] == [{"tok_emb": "alltoall"}] * 4 + [head] * 4  # first stage: shards; last: whole


def test_tables_under_pp_tp_dp(world8):
    out = world8.run(check_parity, "transformer", "dp2-pp2-tp2", "ps", "1f1b", "adagrad")
    assert [o[0] for o in out] == [{"tok_emb": "ps"}] * 4 + [{}] * 4  # the first stage's tp shards
    assert dict(out[-1][1]) == {"tok_emb": "ps", "pos_emb": "dense"}  # positions: a tp layer, kept dense


def check_bytes(model, layout, strategy):
    """One step, unscheduled tables; returns the step's bytes and the ids each table looked up, per lookup."""
    cfg = _cfg(model, layout, strategy, "1f1b", "sgd", extra=("sparse.schedule=false", "sparse.tables=pos_emb=dense"))
    par, _, loader, mesh = _compose(cfg)
    looked: dict[str, list[list[int]]] = {}
    for name, t in (par.tables.tables if par.tables else {}).items():
        t.register_forward_pre_hook(lambda m, a, name=name: looked.setdefault(name, []).append(
            torch.unique(a[0]).tolist()))
    x, y = loader.next_batch()
    comm.counter.end_step()
    par.engine.step(x, y, 0)
    owners = {n: t.plan.owner.tolist() for n, t in par.tables.tables.items() if t.plan is not None}
    return comm.counter.end_step(), looked, owners, dist.get_rank(mesh.get_group("dp"))


def _assert_ps_bytes(mine_out, partner_out, norm_sums: int) -> None:
    """One rank's ps channels against its dp partner's lookups: each forward pulls its unique ids owned by the
    partner (8-byte ids, 16 x 8-byte rows), the step pushes the union once; one 8-byte count per exchange
    (2 pulls, 1 push); the norm: one fp64 per sum."""
    (got, looked, owners, me), (_, other_looked, _, other) = mine_out, partner_out
    row, idb = 16 * 8, 8
    owner = owners["tok_emb"]
    mine = [[i for i in ids if owner[i] != me] for ids in looked["tok_emb"]]
    theirs = [[i for i in ids if owner[i] != other] for ids in other_looked["tok_emb"]]
    assert got["ps.pull"] == {"sent": sum(idb * len(a) + row * len(b) for a, b in zip(mine, theirs)),
                              "recv": sum(idb * len(b) + row * len(a) for a, b in zip(mine, theirs))}
    push_out = len({i for ids in mine for i in ids})
    push_in = len({i for ids in theirs for i in ids})
    assert got["ps.push"] == {"sent": push_out * (idb + row), "recv": push_in * (idb + row)}
    assert got["ps.meta"] == {"sent": 3 * 8, "recv": 3 * 8}
    assert got["sparse.norm"] == {"sent": norm_sums * 8, "recv": norm_sums * 8}


def test_table_bytes_under_pipeline_ps(world4):
    """pp2 x dp2, ps, 2 micro-batches: only the other dp rank's share of the rows crosses."""
    out = world4.run(check_bytes, "transformer", "pp2-dp2", "ps")
    for r in range(2):  # mesh (pp, dp): ranks 0 and 1 hold the first stage
        _assert_ps_bytes(out[r], out[1 - r], norm_sums=1)
    assert all("ps.pull" not in o[0] for o in out[2:])  # the last stage has no table with a full softmax


def test_table_bytes_under_pp_tp_dp_ps(world8):
    """dp2 x pp2 x tp2, ps: each first-stage rank serves its vocabulary shard (32 rows x 16) over its dp group
    (the rank with the same tp coordinate), so the pull/push formula of pp2 x dp2 holds per shard; the norm
    sums over dp, then over the tp shards. The last stage has no table."""
    out = world8.run(check_bytes, "transformer", "dp2-pp2-tp2", "ps")
    for r in range(4):  # mesh (pp, dp, tp), tp innermost: rank r's dp partner is r ^ 2
        _assert_ps_bytes(out[r], out[r ^ 2], norm_sums=2)
    assert all(not any(c.startswith(("ps.", "sparse.")) for c in o[0]) for o in out[4:])


def test_table_bytes_under_tensor_parallel_alltoall(world4):
    """tp2 x dp2, column-split alltoall of each rank's vocabulary shard (32 rows x 16): per lookup the unique
    local ids go to the other owner, each owner answers its 8 columns of every row asked, and the gradients
    go back the same way."""
    out = world4.run(check_bytes, "transformer", "tp2-dp2", "alltoall")
    by_rank = {(r % 2, o[3]): o for r, o in enumerate(out)}  # (tp coordinate, dp rank); tp is the inner dim
    for (tp, me), (got, looked, _, _) in by_rank.items():
        theirs = by_rank[(tp, 1 - me)][1]
        k_me = [len(ids) for ids in looked["tok_emb"]]
        k_other = [len(ids) for ids in theirs["tok_emb"]]
        w = 8 * 8  # 8 columns of 8 bytes
        assert got["a2a.ids"] == {"sent": 8 * sum(k_me), "recv": 8 * sum(k_other)}
        assert got["a2a.fwd"] == {"sent": w * sum(k_other), "recv": w * sum(k_me)}
        assert got["a2a.bwd"] == {"sent": w * sum(k_me), "recv": w * sum(k_other)}
        assert got["a2a.meta"] == {"sent": 8 * len(k_me), "recv": 8 * len(k_me)}


def check_async(schedule, steps, variant="v1"):
    # the Transformer: its first stage holds dense blocks and the input table, both read ahead of their update
    cfg = _cfg("transformer", "pp2-dp2", "ps", schedule, "sgd",
               extra=("train.warmup=0", "train.lr=0.2", "train.momentum=0.9", f"pipeline.predict={variant}"))
    par, _, loader, mesh = _compose(cfg)
    losses = [par.engine.step(*loader.next_batch(), step).loss for step in range(steps)]
    par.engine.drain(steps)
    return losses


def test_async_schedules_with_tables_converge_like_the_flushed_one(world4):
    """Rows read at their current version (docs/sparse.md): async-predict (SpecTrain's guess and the optimizer's
    own) and async learn as 1f1b does."""
    steps = 40
    flushed = world4.run(check_async, "1f1b", steps)[-1]
    for schedule, variant in (("async", "v1"), ("async-predict", "v1"), ("async-predict", "opt")):
        got = world4.run(check_async, schedule, steps, variant)[-1]
        first, end, ref_end = (sum(v) / len(v) for v in (got[:4], got[-8:], flushed[-8:]))
        assert end < 0.95 * first, (schedule, got)
        assert abs(end - ref_end) < 0.05 * ref_end, (schedule, end, ref_end)


def test_pipelined_tables_resume_bit_identical_and_load_into_one_process(world4, tmp_path):
    """pp2 x dp2 with ps tables as ``tessel train`` runs it; the checkpoint's tables load into a plain model."""
    from test_cli import _resumed_equals_uninterrupted

    args = ["--model", "lstm_lm", "--model.softmax", "sampled", "--model.num_sampled", "16", "--model.dim", "12",
            "--model.hidden", "16", "--vocab", "200", "--seq-len", "8", "--batch", "8", "--metrics.progress", "log",
            "--pp", "2", "--dp", "2", "--micro-batches", "2", "--optimizer", "adamw", "--train.weight_decay", "0.1",
            "--sparse", "ps", "--steps", "6", "--nproc", "4"]
    a, before, full, _ = _resumed_equals_uninterrupted(tmp_path, args, world4)
    assert {"embedding.weight", "head.weight.weight", "head.bias.weight"} <= set(a["model"])
    assert "state.head.weight.weight.exp_avg" in a["tables"]
    _loads_into_one_process(full, a, ["model.name=lstm_lm", "model.softmax=sampled", "model.num_sampled=16",
                                      "model.dim=12", "model.hidden=16"], ("embedding.weight", "head.weight.weight"))


def test_sampled_head_under_tp_resumes_bit_identical_and_loads_into_one_process(world4, tmp_path):
    """tp2 x dp2 with the sampled softmax and ps tables as ``tessel train`` runs it: every tp rank's dp group saves
    the whole head (one copy lands in the checkpoint), the token table as the vocabulary shards' DTensor."""
    from test_cli import _resumed_equals_uninterrupted

    args = ["--model.softmax", "sampled", "--model.num_sampled", "16", "--model.dim", "16", "--model.layers", "1",
            "--model.heads", "2", "--vocab", "200", "--seq-len", "8", "--batch", "8", "--metrics.progress", "log",
            "--tp", "2", "--tp-mode", "1d", "--dp", "2", "--optimizer", "adamw", "--train.weight_decay", "0.1",
            "--sparse", "ps", "--steps", "6", "--nproc", "4"]
    a, before, full, _ = _resumed_equals_uninterrupted(tmp_path, args, world4)
    assert {"tok_emb.weight", "head.weight.weight", "head.bias.weight"} <= set(a["model"])
    assert not torch.equal(before["model"]["head.weight.weight"], a["model"]["head.weight.weight"])
    _loads_into_one_process(full, a, ["model.softmax=sampled", "model.num_sampled=16", "model.dim=16",
                                      "model.layers=1", "model.heads=2"], ("tok_emb.weight", "head.weight.weight"))


def _loads_into_one_process(full, saved, overrides, names):
    """The run's last checkpoint (vocabulary 200, sequence 8, step 6) loads into a plain model: each named table
    equals what the resumed run saved."""
    plain = build(load_config(None, overrides + ["data.vocab_size=200", "data.seq_len=8"]), 200)
    path = full / "checkpoints" / "step-00000006"
    load_weights(path, plain, {"model": checkpoint.read_meta(path)["model"]})
    weights = dict(plain.named_parameters())
    for name in names:
        assert torch.equal(weights[name].detach(), saved["model"][name]), name
