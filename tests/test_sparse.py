"""Sparse tables (tessel.sparse): ps and allgather equal single-process training; exact bytes; the pieces.

Parity: fp64, several steps with clipping, SGD and Adagrad (and lazy Adam against torch.optim.SparseAdam),
at 2 and 4 ranks, on the LSTM LM (embedding + sampled-softmax tables) and the Transformer LM.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from composed import planned
from steps import TorchReference, step_side_by_side, tessel_engine
from tessel import comm, sparse
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.errors import ConfigError, PlanError
from tessel.mesh import ParallelDims, build_mesh
from tessel.parallelize import apply_ddp, apply_sparse, parallelize, row_optimizer
from tessel.sparse.alltoall import AllToAllTable
from tessel.sparse.partition import plan_rows
from tessel.sparse.rowopt import RowOptimizer
from tessel.train.build import build, build_data

SMALL = {
    "transformer_lm": ["model.dim=16", "model.layers=1", "model.heads=2", "data.vocab_size=64", "data.seq_len=8"],
    "transformer_sampled": ["model.name=transformer_lm", "model.dim=16", "model.layers=1", "model.heads=2",
                            "model.softmax=sampled", "model.num_sampled=16", "data.vocab_size=80", "data.seq_len=8"],
    "lstm_lm": ["model.dim=12", "model.hidden=16", "model.softmax=sampled", "model.num_sampled=16",
                "data.vocab_size=80", "data.seq_len=6"],
}
ATOL = 1e-10


def _batch(loader, dtype=torch.float64):
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in loader.next_batch())


def check_sparse_parity(name: str, strategy: str, optimizer: str, micro: int = 1, steps: int = 3, hosts: int = 0,
                        extra: tuple = ()):
    p, r = dist.get_world_size(), dist.get_rank()
    model = name.replace("_sampled", "_lm")
    cfg = load_config(None, [f"model.name={model}", *SMALL[name], "train.dtype=float64", "train.global_batch=8",
                             f"train.micro_batches={micro}", f"train.optimizer={optimizer}", "train.lr=0.05",
                             "train.warmup=1", "train.clip=0.5", f"train.steps={steps}", "train.momentum=0",
                             f"sparse.strategy={strategy}", "sparse.max_touched=1.0", f"sparse.hosts={hosts}",
                             *extra])
    dims = ParallelDims.resolve(p)
    mesh = build_mesh(dims, timeout=20)
    data = build_data(cfg)
    vocab = data.vocab_size
    torch.manual_seed(1)
    ref = build(cfg, vocab).double()
    torch.manual_seed(1)
    model = build(cfg, vocab).double()
    loader = ShardedLoader(data, 8, r, p)
    peek = ShardedLoader(data, 8, r, p)
    found = sparse.survey(model, [_batch(peek), _batch(peek)])
    plan, settings = planned(cfg)
    tables, _ = apply_sparse(model, found, plan, row_optimizer(plan, settings), mesh.get_group("dp"), 20)
    if hosts:
        assert all(t.hosts for t in tables.tables.values())
    assert set(tables.tables) == {n for n, m in ref.named_modules() if isinstance(m, nn.Embedding)}
    for n, t in tables.tables.items():
        if isinstance(t, AllToAllTable):
            # scheduled, a column-split table is fetched a step ahead for the batch tensor its ids begin with: the
            # input embedding for the inputs; a sampled softmax's weight for the targets (its candidates then) if asked
            ahead = n in ("embedding", "tok_emb") or (n.startswith("head.") and plan.sparse.prefetch_all)
            assert t.lookahead == (t.schedule and t.split == "column" and ahead), n
            assert (t.feed, t.more) == ((1, True) if n.startswith("head.") else (0, False)), n
    model = apply_ddp(model, mesh.get_group("dp"))
    ref_loader = ShardedLoader(data, 8, 0, 1)
    engine = tessel_engine(model, cfg.train, tables=tables)
    ref_engine = TorchReference(ref, cfg.train)
    ref_res = step_side_by_side(engine, ref_engine, loader, ref_loader, steps, p, ATOL)
    ref_params = dict(ref.named_parameters())
    for n, a in model.module.named_parameters():
        if n.endswith("k_proj.bias"):
            # softmax ignores a shift shared by every key, so this gradient is rounding noise (~1e-17), which
            # Adagrad/Adam scale up to lr-sized steps: any change in summation order moves it
            continue
        torch.testing.assert_close(a, ref_params[n], rtol=0, atol=ATOL, msg=n)
    torch.manual_seed(1)
    init = dict(build(cfg, vocab).double().named_parameters())
    for n, t in tables.tables.items():
        full = sparse.full_table(t)
        torch.testing.assert_close(full, ref_params[f"{n}.weight"], rtol=0, atol=ATOL, msg=n)
        assert float((full - init[f"{n}.weight"].detach()).abs().max()) > 1e-7, f"table {n} never moved"
    return float(ref_res.loss)


# The sampled softmax draws candidates per forward pass, so the LSTM LM runs one micro-batch here.
CASES = [("lstm_lm", "ps", "sgd", 1), ("lstm_lm", "ps", "adagrad", 1), ("lstm_lm", "allgather", "adagrad", 1),
         ("transformer_lm", "ps", "adagrad", 2), ("transformer_lm", "allgather", "sgd", 2)]


@pytest.mark.parametrize("name,strategy,optimizer,micro", CASES)
def test_sparse_parity_2_ranks(world2, name, strategy, optimizer, micro):
    assert len(set(world2.run(check_sparse_parity, name, strategy, optimizer, micro))) == 1


@pytest.mark.parametrize("name,strategy,optimizer", [("lstm_lm", "ps", "adagrad"), ("transformer_lm", "ps", "sgd"),
                                                      ("lstm_lm", "allgather", "sgd")])
def test_sparse_parity_4_ranks(world4, name, strategy, optimizer):
    assert len(set(world4.run(check_sparse_parity, name, strategy, optimizer))) == 1


def test_ps_local_aggregation_parity_4_ranks_on_2_hosts(world4):
    assert len(set(world4.run(check_sparse_parity, "lstm_lm", "ps", "adagrad", hosts=2))) == 1


class Bag(nn.Module):
    def __init__(self, rows=40, dim=6):
        super().__init__()
        self.emb = nn.Embedding(rows, dim)
        self.out = nn.Linear(dim, 1)

    def forward(self, ids, y):
        return ((self.out(self.emb(ids)).squeeze(-1).sum(-1) - y) ** 2).mean()


def check_lazy_adam(steps: int = 4):
    """ps with lazy Adam rows == one process with the table's gradient sparse and torch.optim.SparseAdam."""
    p, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 40, (8, 5), generator=g), torch.randn(8, generator=g, dtype=torch.float64))
               for _ in range(steps)]
    torch.manual_seed(0)
    ref = Bag().double()
    ref.emb.sparse = True
    torch.manual_seed(0)
    model = Bag().double()
    local = [(x.chunk(p)[r], y.chunk(p)[r]) for x, y in batches]
    tables = sparse.shard(model, local[:2], "ps", "adam", lr=0.01)
    ddp = apply_ddp(model, build_mesh(ParallelDims.resolve(p), timeout=20).get_group("dp"))
    dense = torch.optim.Adam(ddp.parameters(), lr=0.01)
    ref_dense = torch.optim.Adam(ref.out.parameters(), lr=0.01)
    ref_rows = torch.optim.SparseAdam([ref.emb.weight], lr=0.01)
    for (x, y), (rx, ry) in zip(local, batches):
        ddp(x, y).backward()
        tables.reduce()
        tables.step()
        dense.step()
        dense.zero_grad()
        ref(rx, ry).backward()
        ref_dense.step()
        ref_rows.step()
        ref_dense.zero_grad()
        ref_rows.zero_grad()
    torch.testing.assert_close(sparse.full_table(tables.tables["emb"]), ref.emb.weight.detach(), rtol=0, atol=ATOL)
    torch.testing.assert_close(model.out.weight, ref.out.weight, rtol=0, atol=ATOL)


def check_torch_sparse_parity(optimizer: str, steps: int = 3) -> float:
    """The peer ``torch-sparse`` (torch DDP with sparse table gradients, through ``parallelize`` as ``tessel train``
    builds it) against one process with dense tables and torch's optimizer, clipping and LR rule."""
    p, r = dist.get_world_size(), dist.get_rank()
    cfg = load_config(None, ["model.name=lstm_lm", *SMALL["lstm_lm"], "train.dtype=float64", "train.global_batch=8",
                             f"train.optimizer={optimizer}", "train.lr=0.05", "train.warmup=1", "train.clip=0.5",
                             f"train.steps={steps}", "train.momentum=0", "sparse.strategy=torch-sparse"])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    ref = build(cfg, data.vocab_size).double()
    torch.manual_seed(1)
    model = build(cfg, data.vocab_size).double()
    peek = ShardedLoader(data, 8, r, p)
    par = parallelize(model, plan, mesh, [_batch(peek), _batch(peek)], settings)
    assert {m.sparse for m in par.module.modules() if isinstance(m, nn.Embedding)} == {True}
    ref_res = step_side_by_side(par.engine, TorchReference(ref, cfg.train), ShardedLoader(data, 8, r, p),
                                ShardedLoader(data, 8, 0, 1), steps, p, ATOL)
    want = dict(ref.named_parameters())
    for n, a in par.module.named_parameters():
        torch.testing.assert_close(a, want[n.removeprefix("module.")], rtol=0, atol=ATOL, msg=n)
    return float(ref_res.loss)


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_torch_sparse_trains_as_one_process(world2, optimizer):
    """torch's fused optimizer kernels refuse sparse gradients: the tables step in a group without them."""
    assert len(set(world2.run(check_torch_sparse_parity, optimizer))) == 1


def test_lazy_adam_equals_sparse_adam(world2):
    world2.run(check_lazy_adam)


WIRE = {8: None, 2: torch.bfloat16}  # bytes per element crossing -> the tables' wire dtype (fp64 tables)


def _on_wire(tables, elem: int) -> None:
    """Rows and row gradients cross in bf16 where ``elem`` is 2, as serve(..., wire=bf16) sets under bf16-mixed."""
    for t in tables.tables.values():
        t.wire = WIRE[elem]


def check_bytes(strategy: str, elem: int = 8) -> dict:
    """Known ids on 2 ranks; rows owned alternately (partitions=2, even counts)."""
    r = dist.get_rank()
    torch.manual_seed(0)
    model = Bag(rows=10, dim=3).double()
    ids = [torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])][r]
    y = torch.zeros(1, dtype=torch.float64)
    tables = sparse.shard(model, [(ids, y)], strategy, "sgd", lr=0.1, partitions=2)
    _on_wire(tables, elem)
    if strategy == "ps":
        assert tables.tables["emb"].plan.owner.tolist() == [0, 1] * 5
    comm.counter.end_step()
    model(ids, y).backward()
    forward = comm.counter.end_step()
    tables.reduce()
    return {"forward": forward, "reduce": comm.counter.end_step()}


@pytest.mark.parametrize("elem", [8, 2])
def test_exact_bytes_ps_and_allgather(world2, elem):
    """fp64 rows and gradients (elem 8), or crossing in bf16 (elem 2, mixed precision): the ids stay 8 bytes."""
    row = 3 * elem
    ps = world2.run(check_bytes, "ps", elem)
    # rank 0 wants {0,1,2,5}: 1 and 5 live on rank 1; rank 1 wants {1,3,4}: 4 lives on rank 0.
    assert ps[0]["forward"]["ps.pull"] == {"sent": 2 * 8 + 1 * row, "recv": 1 * 8 + 2 * row}
    assert ps[1]["forward"]["ps.pull"] == {"sent": 1 * 8 + 2 * row, "recv": 2 * 8 + 1 * row}
    assert ps[0]["forward"]["ps.meta"] == {"sent": 8, "recv": 8}
    assert ps[0]["reduce"]["ps.push"] == {"sent": 2 * (8 + row), "recv": 1 * (8 + row)}
    assert ps[1]["reduce"]["ps.push"] == {"sent": 1 * (8 + row), "recv": 2 * (8 + row)}
    assert ps[0]["reduce"]["sparse.norm"] == {"sent": 8, "recv": 8}
    ag = world2.run(check_bytes, "allgather", elem)
    assert "sparse.allgather" not in ag[0]["forward"]  # the table is local: no traffic in the forward pass
    assert ag[0]["reduce"]["sparse.allgather"] == {"sent": 4 * (8 + row), "recv": 3 * (8 + row)}
    assert ag[1]["reduce"]["sparse.allgather"] == {"sent": 3 * (8 + row), "recv": 4 * (8 + row)}


def check_wire_sum(strategy: str) -> float:
    """An fp64 table whose rows and row gradients cross in bf16: after one SGD step, its largest distance from the
    table updated with every rank's gradient rounded to bf16 once and summed in fp64 (the owner's sum is at the
    table's width, not the wire's)."""
    r = dist.get_rank()
    torch.manual_seed(0)
    model = Bag(rows=10, dim=3).double()
    w0 = model.emb.weight.detach().clone()
    ids = [torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])][r]
    y = torch.ones(1, dtype=torch.float64)
    ref = copy.deepcopy(model)
    if strategy != "allgather":  # looked-up rows cross too, so the forward sees them rounded
        ref.emb.weight.data = w0.to(torch.bfloat16).double()
    ref(ids, y).backward()
    summed = ref.emb.weight.grad.to(torch.bfloat16).double()  # this rank's contribution as it crosses
    dist.all_reduce(summed)  # the reference's own fp64 sum of the rounded contributions
    tables = sparse.shard(model, [(ids, y)], strategy, "sgd", lr=0.1, partitions=2)
    _on_wire(tables, 2)
    model(ids, y).backward()
    tables.reduce()
    tables.step()
    return float((sparse.full_table(tables.tables["emb"]) - (w0 - 0.1 * summed / 2)).abs().max())


def test_bf16_row_gradients_are_rounded_once_and_summed_at_full_width(world2):
    for strategy in ("ps", "allgather", "alltoall"):
        assert max(world2.run(check_wire_sum, strategy)) < 1e-12, strategy


def check_host_bytes(elem: int = 8) -> dict:
    """4 ranks as 2 hosts x 2: a row crosses a host link once per host however many local ranks touched it."""
    r = dist.get_rank()
    torch.manual_seed(0)
    model = Bag(rows=16, dim=3).double()
    ids = [[0, 1, 2, 3, 9], [1, 2, 3, 5, 9], [2, 6, 10, 11, 12], [6, 7, 12, 13, 14]][r]
    y = torch.zeros(1, dtype=torch.float64)
    tables = sparse.shard(model, [(torch.tensor([ids]), y)], "ps", "sgd", lr=0.1, partitions=4, hosts=2)
    _on_wire(tables, elem)
    owner = tables.tables["emb"].plan.owner
    comm.counter.end_step()
    model(torch.tensor([ids]), y).backward()
    tables.reduce()
    return {"owner": owner.tolist(), "bytes": comm.counter.end_step()}


@pytest.mark.parametrize("elem", [8, 2])
def test_ps_host_aggregation_bytes(world4, elem):
    out = world4.run(check_host_bytes, elem)
    owner = out[0]["owner"]
    assert sorted(set(owner)) == [0, 1, 2, 3]
    ids = [[0, 1, 2, 3, 9], [1, 2, 3, 5, 9], [2, 6, 10, 11, 12], [6, 7, 12, 13, 14]]
    row = 8 + 3 * elem  # id + the host's summed row gradient (fp64, or bf16 under mixed precision)
    for h, (a, b) in enumerate([(0, 1), (2, 3)]):
        union = set(ids[a]) | set(ids[b])
        remote = [i for i in union if owner[i] // 2 != h]  # owned by a rank of the other host
        sent = sum(out[r]["bytes"]["ps.push"]["sent"] for r in (a, b))
        assert sent == len(remote) * row
        # without aggregation each rank would push its own remote rows: rows touched by both count twice
        flat = sum(len([i for i in ids[r] if owner[i] // 2 != h]) for r in (a, b))
        assert len(remote) <= flat
        if h == 0:  # ranks 0 and 1 share rows 1, 2, 3, 9 of three residues mod 4; host 1 owns two residues
            assert len(remote) < flat


class TwoTables(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.bias = nn.Embedding(10, 3), nn.Embedding(10, 1)

    def forward(self, ids, y):
        return (self.emb(ids).sum() + self.bias(ids).sum() - y.sum()) ** 2


def check_fused_push_bytes(elem: int = 8) -> dict:
    r = dist.get_rank()
    torch.manual_seed(0)
    model = TwoTables().double()
    ids = [torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])][r]
    y = torch.zeros(1, dtype=torch.float64)
    tables = sparse.shard(model, [(ids, y)], "ps", "sgd", lr=0.1, partitions=2)
    _on_wire(tables, elem)
    model(ids, y).backward()
    comm.counter.end_step()
    tables.reduce()
    return comm.counter.end_step()


@pytest.mark.parametrize("elem", [8, 2])
def test_fused_push_of_two_tables_moves_the_bytes_of_two_pushes(world2, elem):
    out = world2.run(check_fused_push_bytes, elem)
    # rank 0 pushes rows 1 and 5 (owned by rank 1) of both tables: ids 8 B each, values 3 and 1 wide
    a, b = 8 + 3 * elem, 8 + 1 * elem
    assert out[0]["ps.push"] == {"sent": 2 * a + 2 * b, "recv": 1 * a + 1 * b}
    assert out[0]["ps.meta"] == {"sent": 2 * 8, "recv": 2 * 8}  # one [P, T] block of counts


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_row_optimizer_equals_dense_torch_on_touched_rows(kind):
    torch.manual_seed(0)
    table = torch.randn(12, 4, dtype=torch.float64)
    ref = table.clone().requires_grad_(True)
    opt = RowOptimizer(kind, lr=0.1)
    state = opt.init(table)
    torch_opt = torch.optim.SGD([ref], lr=0.1) if kind == "sgd" else torch.optim.Adagrad([ref], lr=0.1)
    for step in range(3):
        rows = torch.tensor([1, 4, 7 + step])
        grads = torch.randn(3, 4, dtype=torch.float64)
        opt.update(table, state, rows, grads)
        ref.grad = torch.zeros_like(ref).index_add_(0, rows, grads)
        torch_opt.step()
    torch.testing.assert_close(table, ref.detach(), rtol=0, atol=1e-12)


def test_partition_balances_zipf_rows():
    ranks = torch.arange(1, 5001, dtype=torch.float64)
    freq = 1e5 / ranks  # Zipf: row 0 is the hottest
    plan = plan_rows(freq, freq, owners=4)
    assert plan.imbalance < 1.05, plan.describe()
    contiguous = torch.arange(5000) // 1250  # TorchRec-style row-wise blocks put the hot head on one owner
    load = torch.zeros(4, dtype=torch.float64).index_add_(0, contiguous, freq)
    assert float(load.max() / load.mean()) > 2.0
    # every row has exactly one (owner, local index) and local indices are 0..count-1 per owner
    for o in range(4):
        mine = plan.local[plan.owner == o]
        assert sorted(mine.tolist()) == list(range(plan.counts[o]))


def test_detection_and_choices():
    from tessel.models import LSTMLM, TransformerLM

    tied = TransformerLM(vocab_size=50, seq_len=4, dim=8, layers=1, heads=2, tie_embeddings=True)
    infos = {t.name: t for t in sparse.find_tables(tied)}
    assert set(infos) == {"tok_emb", "pos_emb"} and infos["tok_emb"].shared_with
    x = torch.randint(0, 50, (2, 4))
    tables = sparse.shard(tied, [(x, x)], "allgather", "sgd", group=None, max_touched=1.0)
    why = {c.info.name: (c.strategy.name, c.why) for c in tables.choices}
    assert why["tok_emb"][0] == "dense" and "shared" in why["tok_emb"][1]
    lstm = LSTMLM(vocab_size=100, dim=8, hidden=16, softmax="sampled", num_sampled=10)
    with pytest.raises(PlanError, match="not a table of this model; tables: embedding, head.weight, head.bias"):
        sparse.shard(lstm, [], "ps", overrides={"emb": "ps"})
    with pytest.raises(ConfigError, match="name=strategy"):
        load_config(None, ["sparse.tables=embedding:ps"])
    with pytest.raises(ConfigError, match="valid: sgd, adagrad"):
        load_config(None, ["sparse.strategy=torch-sparse", "train.optimizer=adamw"])
