"""alltoall tables (EmbRace), their scheduling, and the auto cost model.

Parity: fp64 against one process, several steps with clipping, scheduled and unscheduled, on the LSTM
LM and the Transformer LM (sampled softmax, with one and two micro-batches, and full softmax with two), SGD and Adagrad,
2 and 4 ranks. Bytes: exact per channel for known ids, column and row split.
"""

import dataclasses

import pytest
import torch
import torch.distributed as dist

from tessel import comm, sparse
from tessel.errors import PlanError
from tessel.models import LSTMLM
from tessel.plan import TablePolicy
from tessel.sparse.cost import Link, Sparsity, choose, estimate
from tessel.sparse.detect import find_tables, measure
from tessel.sparse.plan import follows
from tessel.sparse.schedule import Clock
from test_sparse import Bag, check_sparse_parity

UNSCHEDULED = ("sparse.schedule=false",)
# (model, optimizer, micro-batches, extra config)
CASES = [("lstm_lm", "sgd", 1, ()), ("lstm_lm", "adagrad", 1, UNSCHEDULED),
         ("lstm_lm", "adagrad", 1, ()), ("lstm_lm", "sgd", 1, UNSCHEDULED),
         ("transformer_sampled", "adagrad", 1, ()), ("transformer_sampled", "sgd", 1, UNSCHEDULED),
         ("transformer_sampled", "sgd", 1, ()), ("transformer_sampled", "adagrad", 1, UNSCHEDULED),
         ("transformer_lm", "adagrad", 2, ()), ("lstm_lm", "adagrad", 1, ("sparse.split=row",)),
         # the sampled softmax's rows prefetched for the targets (asked for), two forwards each drawing its own
         # candidates, and one
         ("lstm_lm", "sgd", 2, ("sparse.prefetch_all=true",)), ("lstm_lm", "adagrad", 1, ("sparse.prefetch_all=true",))]


def _id(case):
    name, opt, micro, extra = case
    how = "-".join(e.split("=")[0].split(".")[1] + e.split("=")[1] for e in extra)
    return f"{name}-{opt}-m{micro}-{how or 'sched'}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_alltoall_parity_2_ranks(world2, case):
    name, opt, micro, extra = case
    assert len(set(world2.run(check_sparse_parity, name, "alltoall", opt, micro, steps=4, extra=extra))) == 1


@pytest.mark.parametrize("case", CASES[:8], ids=[_id(c) for c in CASES[:8]])
def test_alltoall_parity_4_ranks(world4, case):
    name, opt, micro, extra = case
    assert len(set(world4.run(check_sparse_parity, name, "alltoall", opt, micro, steps=3, extra=extra))) == 1


def check_alltoall_bytes(split: str, schedule: bool, elem: int = 8) -> list:
    """Known ids on 2 ranks, a 10 x 4 fp64 table; with scheduling, the ids of step 2 are known in step 1. Rows and
    their gradients cross at ``elem`` bytes an element (2: in bf16, as under mixed precision)."""
    r = dist.get_rank()
    torch.manual_seed(0)
    model = Bag(rows=10, dim=4).double()
    steps = [[torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])][r],
             [torch.tensor([[5, 6, 6, 7, 0]]), torch.tensor([[9, 9, 9, 9, 9]])][r]]
    y = torch.zeros(1, dtype=torch.float64)
    tables = sparse.shard(model, [(steps[0], y)], "alltoall", "sgd", lr=0.1, partitions=2, split=split,
                          schedule=schedule)
    t = tables.tables["emb"]
    t.wire = {8: None, 2: torch.bfloat16}[elem]  # as serve(..., wire=bf16) sets it under bf16-mixed
    assert t.lookahead == (schedule and split == "column")
    out = []
    comm.counter.end_step()
    for i, ids in enumerate(steps):
        tables.begin_step(ids, steps[i + 1] if i + 1 < len(steps) else None)
        ahead = comm.counter.end_step()
        model(ids, y).backward()
        forward = comm.counter.end_step()  # forward and backward pass
        tables.reduce()
        tables.step()
        busy, waits, work = tables.timing()
        assert busy >= 0 and work >= 0 and all(v >= 0 for v in waits.values())
        out.append({"ahead": ahead, "forward": forward, "reduce": comm.counter.end_step(), "waits": sorted(waits)})
    return out


@pytest.mark.parametrize("b", [8, 2])
def test_alltoall_exact_bytes_column_and_row(world2, b):
    """Rows and row gradients at ``b`` bytes an element (fp64, or bf16 under mixed precision); ids, counts and the
    norm stay 8 bytes."""
    i = 8
    # step 1: rank 0 asks {0,1,2,5} (k=4), rank 1 {1,3,4} (k=3); column split: 2 columns per rank
    col = world2.run(check_alltoall_bytes, "column", False, b)
    f0, f1 = col[0][0]["forward"], col[1][0]["forward"]
    assert f0["a2a.meta"] == {"sent": i, "recv": i}
    assert f0["a2a.ids"] == {"sent": 4 * i, "recv": 3 * i}
    assert f0["a2a.fwd"] == {"sent": 3 * 2 * b, "recv": 4 * 2 * b}  # rank 1's 3 rows, my 2 columns
    assert f1["a2a.fwd"] == {"sent": 4 * 2 * b, "recv": 3 * 2 * b}
    assert col[0][0]["reduce"]["a2a.bwd"] == {"sent": 4 * 2 * b, "recv": 3 * 2 * b}  # no ids resent
    assert col[0][0]["reduce"]["sparse.norm"] == {"sent": i, "recv": i}
    assert not col[0][0]["ahead"]
    # unscheduled, every exchange blocks: each step waits for its route, its rows and its gradients' exchange
    assert all(step["waits"] == ["grads", "ids", "rows"] for r in col for step in r)
    # row split, rows owned alternately: rank 0 asks 1 and 5 of rank 1; rank 1 asks 4 of rank 0
    row = world2.run(check_alltoall_bytes, "row", False, b)
    f0 = row[0][0]["forward"]
    assert f0["a2a.meta"] == {"sent": i, "recv": i}
    assert f0["a2a.ids"] == {"sent": 2 * i, "recv": 1 * i}
    assert f0["a2a.fwd"] == {"sent": 1 * 4 * b, "recv": 2 * 4 * b}
    assert row[0][0]["reduce"]["a2a.bwd"] == {"sent": 2 * 4 * b, "recv": 1 * 4 * b}
    # scheduled: step 2's rows are fetched during step 1, so step 2's forward asks for nothing; gradients
    # leave during the backward pass (from the hook), not in reduce
    sched = world2.run(check_alltoall_bytes, "column", True, b)
    for r in range(2):
        assert set(sched[r][1]["forward"]) == {"a2a.bwd"}, sched[r][1]["forward"]
        assert "a2a.bwd" not in sched[r][1]["reduce"]
        for ch in ("a2a.fwd", "a2a.bwd"):  # the same rows move, in two priority phases
            plain = sum(step[k].get(ch, {}).get("sent", 0) for step in col[r] for k in step if k != "waits")
            ahead = sum(step[k].get(ch, {}).get("sent", 0) for step in sched[r] for k in step if k != "waits")
            assert plain == ahead, (ch, plain, ahead)
        # step 1 asks as usual (counts, unique ids); step 2's 5 raw ids go ahead as int32, no counts
        assert sched[r][0]["ahead"]["a2a.meta"] == {"sent": i, "recv": i}
        assert sched[r][0]["ahead"]["a2a.ids"]["sent"] == [4, 3][r] * i + 5 * 4
        assert sum(step[k].get("a2a.meta", {}).get("sent", 0) for step in sched[r] for k in step if k != "waits") == i
        # step 2's route was known in step 1, and its rows came in two phases: those final before step 1's update
        # (ids 6, 7 of rank 0; 9 of rank 1) and those the update made final (0 and 5, which step 1 touched)
        assert sched[r][0]["waits"] == ["grads", "ids", "rows"] and sched[r][1]["waits"] == ["grads", "late_rows",
                                                                                             "rows"], sched[r]


class WithBias(torch.nn.Module):
    """A table and a one-column table read with the same ids tensor, as a sampled softmax reads its weight and bias."""

    def __init__(self, rows=10, dim=4):
        super().__init__()
        self.emb, self.bias = torch.nn.Embedding(rows, dim), torch.nn.Embedding(rows, 1)

    def forward(self, ids, y):
        return ((self.emb(ids).sum(-1) + self.bias(ids).squeeze(-1)).sum() - y.sum()) ** 2


def check_bias_route() -> dict:
    r = dist.get_rank()
    torch.manual_seed(0)
    model = WithBias().double()
    ids = [torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])][r]
    y = torch.zeros(1, dtype=torch.float64)
    tables = sparse.shard(model, [(ids, y)], "alltoall", "sgd", lr=0.1, partitions=2, schedule=False)
    splits = {n: t.split for n, t in tables.tables.items()}
    comm.counter.end_step()
    model(ids, y).backward()
    forward = comm.counter.end_step()
    tables.reduce()
    tables.step()
    owner = tables.tables["bias"].plan.owner
    return {"splits": splits, "forward": forward, "reduce": comm.counter.end_step(), "owner": owner.tolist(),
            "bias": sparse.full_table(tables.tables["bias"]), "emb": sparse.full_table(tables.tables["emb"])}


def test_a_row_split_takes_its_route_from_a_column_split_of_the_same_ids(world2):
    """The bias (one column: split by rows) is read with the weight's ids tensor; the weight's column split sent
    every rank's ids to every owner, so the bias's route needs no exchange: its ids and counts never cross, only its
    rows and gradients, between each id's one owner and the ranks that asked for it. The update is one process's."""
    i, b = 8, 8  # an id; a bias row (one fp64 column)
    out = world2.run(check_bias_route)
    asked = [{0, 1, 2, 5}, {1, 3, 4}]
    for r in range(2):
        o, other = out[r], asked[1 - r]
        assert o["splits"] == {"emb": "column", "bias": "row"}
        f = o["forward"]
        assert f["a2a.meta"] == {"sent": i, "recv": i}  # the weight's count alone
        assert f["a2a.ids"] == {"sent": len(asked[r]) * i, "recv": len(other) * i}  # the weight's ids alone
        mine_asked = sum(o["owner"][x] == r for x in other)  # the other rank's bias rows this rank serves
        theirs = sum(o["owner"][x] != r for x in asked[r])
        weight = 2 * 8  # a weight row's part on one owner: 2 of 4 fp64 columns
        assert f["a2a.fwd"] == {"sent": len(other) * weight + mine_asked * b,
                                "recv": len(asked[r]) * weight + theirs * b}
        assert o["reduce"]["a2a.bwd"] == {"sent": len(asked[r]) * weight + theirs * b,
                                          "recv": len(other) * weight + mine_asked * b}
    # one process's step on both ranks' batches, their losses averaged as data parallelism averages gradients
    torch.manual_seed(0)
    ref = WithBias().double()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    both = [torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])]
    (sum(ref(x, torch.zeros(1, dtype=torch.float64)) for x in both) / 2).backward()
    opt.step()
    for r in range(2):
        torch.testing.assert_close(out[r]["bias"], ref.bias.weight.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(out[r]["emb"], ref.emb.weight.detach(), rtol=0, atol=1e-12)


def check_prefetch_mismatch():
    r = dist.get_rank()
    model = Bag(rows=10, dim=4).double()
    ids = torch.tensor([[0, 1, 2]]) + r
    y = torch.zeros(1, dtype=torch.float64)
    tables = sparse.shard(model, [(ids, y)], "alltoall", "sgd", lr=0.1)
    tables.begin_step(ids, None)
    with pytest.raises(PlanError, match="prefetched"):
        model(ids + 5, y)
    return True


def test_prefetched_table_refuses_other_ids(world2):
    assert world2.run(check_prefetch_mismatch) == [True, True]


class Head(torch.nn.Module):
    """A table read as a sampled softmax reads its own: the batch's targets, then ids the forward adds itself
    (``extra``, the candidates; the test sets them per step as a sampler would draw them, alike on every rank)."""

    def __init__(self, rows=10, dim=4):
        super().__init__()
        self.emb = torch.nn.Embedding(rows, dim)
        self.register_buffer("extra", torch.tensor([0]))

    def forward(self, x, y):
        rows = self.emb(torch.cat([y.reshape(-1), self.extra]))
        return ((rows.sum(-1) * torch.arange(1, rows.shape[0] + 1)).sum() - x.sum()) ** 2


def check_targets_prefetched(schedule: bool) -> list:
    """2 ranks, a 10 x 4 fp64 table read by :class:`Head`, two steps as the engine runs them (begin_step with this
    and the next batch, final_backward before the backward, reduce and step)."""
    r = dist.get_rank()
    torch.manual_seed(0)
    model = Head().double()
    x = torch.ones(1, dtype=torch.float64)
    ys = [[torch.tensor([[0, 1, 2, 2]]), torch.tensor([[1, 3, 3, 4]])][r],
          [torch.tensor([[5, 6, 6, 7]]), torch.tensor([[9, 9, 9, 9]])][r]]
    extras = [torch.tensor([5, 1]), torch.tensor([8, 0])]
    model.extra = extras[0]
    tables = sparse.shard(model, [(x, ys[0])], "alltoall", "sgd", lr=0.1, partitions=2, schedule=schedule,
                          prefetch_all=True)
    t = tables.tables["emb"]
    out = {"table": (t.lookahead, t.feed, t.more), "steps": []}
    comm.counter.end_step()
    for i, y in enumerate(ys):
        model.extra = extras[i]
        tables.begin_step((x, y), (x, ys[i + 1]) if i + 1 < len(ys) else None)
        ahead = comm.counter.end_step()
        loss = model(x, y)
        tables.final_backward(True)
        loss.backward()
        forward = comm.counter.end_step()
        tables.reduce()
        tables.step()
        out["steps"].append({"ahead": ahead, "forward": forward, "reduce": comm.counter.end_step(),
                             "loss": float(loss.detach()), "waits": sorted(tables.timing()[1])})
    out["table_after"] = sparse.full_table(t)
    return out


def test_a_sampled_softmax_table_is_prefetched_for_the_targets_and_fetches_its_candidates(world2):
    """The next step's rows for its targets travel during this step, final ones early and those this step's update
    changes (its targets' and its candidates' rows, every rank's) after it; the forward fetches only the candidates
    not among its targets. The same rows, values and losses as unscheduled."""
    i, b = 8, 8 * 2  # an id; a row's part on one owner (2 of 4 fp64 columns)
    sched, plain = world2.run(check_targets_prefetched, True), world2.run(check_targets_prefetched, False)
    for r in range(2):
        assert sched[r]["table"] == (True, 1, True)  # fed from the batch's second tensor, with ids of its own
        for s, u in zip(sched[r]["steps"], plain[r]["steps"]):
            assert abs(s["loss"] - u["loss"]) < 1e-10, (s["loss"], u["loss"])
        torch.testing.assert_close(sched[r]["table_after"], plain[r]["table_after"], rtol=0, atol=1e-12)
    # step 1: targets {0,1,2} and {1,3,4} asked and served ahead, with step 2's 4 raw targets as int32
    one = [s["steps"][0] for s in sched]
    for r in range(2):
        assert one[r]["ahead"]["a2a.meta"] == {"sent": i, "recv": i}
        assert one[r]["ahead"]["a2a.ids"] == {"sent": 3 * i + 4 * 4, "recv": 3 * i + 4 * 4}
        assert one[r]["ahead"]["a2a.fwd"] == {"sent": 3 * b, "recv": 3 * b}
    # its forward: the candidates 5 and 1; 1 is a target of both ranks, 5 of neither, so each asks for row 5 alone
    # (counts, one id, one row); then the early phase of step 2: rank 0 asks {5,6,7}, rank 1 {9}; step 1 touched
    # {0..5}, so 6, 7 (to rank 0) and 9 (to rank 1) are final already, 5 is not
    f = [s["forward"] for s in one]
    assert f[0]["a2a.meta"] == f[1]["a2a.meta"] == {"sent": i, "recv": i}
    assert f[0]["a2a.ids"] == f[1]["a2a.ids"] == {"sent": 1 * i, "recv": 1 * i}
    assert f[0]["a2a.fwd"] == {"sent": (1 + 1) * b, "recv": (1 + 2) * b}
    assert f[1]["a2a.fwd"] == {"sent": (1 + 2) * b, "recv": (1 + 1) * b}
    assert f[0]["a2a.bwd"] == f[1]["a2a.bwd"] == {"sent": (3 + 1) * b, "recv": (3 + 1) * b}  # leaf and candidate
    # after the update, the late phase: row 5 to rank 0
    assert one[0]["reduce"]["a2a.fwd"] == {"sent": 0, "recv": b} and one[1]["reduce"]["a2a.fwd"] == {"sent": b,
                                                                                                    "recv": 0}
    # step 2 asks nothing ahead; its forward asks for its candidates 8 and 0, none of them a target
    two = [s["steps"][1] for s in sched]
    assert not two[0]["ahead"] and not two[1]["ahead"]
    assert two[0]["forward"]["a2a.ids"] == {"sent": 2 * i, "recv": 2 * i}
    assert two[0]["forward"]["a2a.fwd"] == {"sent": 2 * b, "recv": 2 * b}
    assert two[0]["forward"]["a2a.bwd"] == {"sent": (3 + 2) * b, "recv": (1 + 2) * b}
    assert sched[0]["steps"][1]["waits"] == ["grads", "ids", "late_rows", "rows"]
    # the rows and row gradients that move are the unscheduled path's, in other pieces
    for r in range(2):
        for ch in ("a2a.fwd", "a2a.bwd"):
            got = [sum(s[k].get(ch, {}).get("sent", 0) for s in run[r]["steps"] for k in ("ahead", "forward",
                                                                                          "reduce"))
                   for run in (sched, plain)]
            assert got[0] == got[1], (ch, got)


def check_auto_plan(rate: float) -> tuple:
    r = dist.get_rank()
    torch.manual_seed(0)
    model = Bag(rows=4000, dim=32)
    g = torch.Generator().manual_seed(r)
    batches = [(torch.randint(0, 4000, (8, 16), generator=g), torch.zeros(8)) for _ in range(2)]
    unmirrored = Bag(rows=4000, dim=32)  # the dense optimizer has no row mirror (NAdamW): auto keeps it dense
    (kept,) = sparse.serve(unmirrored, sparse.survey(unmirrored, batches), TablePolicy(link_mbit=rate), None).choices
    tables = sparse.shard(model, batches, "auto", "sgd", lr=0.1, link_mbit=rate)
    (choice,) = tables.choices
    return choice.strategy.name, choice.split, sorted(choice.estimates), tables.describe(), kept.strategy.name, kept.why


def test_auto_plan_is_printed_and_agreed(world2):
    out = world2.run(check_auto_plan, 100.0)
    assert out[0][4:] == ("dense", "no row optimizer mirrors this run's optimizer")
    assert out[0][:2] == out[1][:2]
    assert out[0][2] == ["allgather", "alltoall/column", "alltoall/row", "dense", "ps"]
    assert out[0][0] in ("allgather", "ps", "alltoall")  # 128 of 4000 rows per rank: never dense
    text = out[0][3]
    assert "predicted per step" in text and "cost model, link 100 Mbit/s (given)" in text


def test_cost_model_bytes_and_choice():
    s = Sparsity(rows=100_000, dim=64, elem=4, k=1000, u=3000, u_host=1000, late=0.5, fed=True)
    link = Link(rate=125e6, latency=1e-3, per_elem=1e-9)
    est = estimate(s, ranks=4, hosts=4, link=link, compute=0.2)
    row = 64 * 4
    assert est["dense"].bytes == 2 * 3 / 4 * 100_000 * row
    assert est["allgather"].bytes == 3 * 1000 * (row + 8)
    assert est["ps"].bytes == 3 / 4 * 1000 * (2 * row + 16)
    assert est["alltoall/column"].bytes == 3 * 1000 * 8 + 2 * 3 / 4 * 1000 * row
    assert est["alltoall/row"].bytes == 3 / 4 * 1000 * (2 * row + 8)
    assert choose(est, ("dense", "allgather", "ps", "alltoall")) == "alltoall/column"
    assert choose(est, ("dense", "allgather")) == "allgather"
    # under mixed precision rows and row gradients cross in bf16 (2 bytes an element); the dense gradient's
    # all-reduce stays at the table's 4
    half = estimate(dataclasses.replace(s, wire=2), ranks=4, hosts=4, link=link, compute=0.2)
    assert half["dense"].bytes == est["dense"].bytes
    assert half["allgather"].bytes == 3 * 1000 * (64 * 2 + 8)
    assert half["ps"].bytes == 3 / 4 * 1000 * (2 * 64 * 2 + 16)
    assert half["alltoall/column"].bytes == 3 * 1000 * 8 + 2 * 3 / 4 * 1000 * 64 * 2
    assert half["alltoall/row"].bytes == 3 / 4 * 1000 * (2 * 64 * 2 + 8)
    # read with the same ids right after a column-split table (a sampled softmax's bias after its weight), a table
    # takes that table's route under either split: no ids cross, and its two id collectives are not run
    after = estimate(dataclasses.replace(s, follows=True, fed=False), ranks=4, hosts=4, link=link, compute=0.2,
                     schedule=False)
    assert after["alltoall/column"].bytes == 2 * 3 / 4 * 1000 * row
    assert after["alltoall/row"].bytes == 3 / 4 * 1000 * 2 * row
    assert after["ps"].bytes == est["ps"].bytes and after["allgather"].bytes == est["allgather"].bytes
    assert after["alltoall/row"].time == pytest.approx(after["alltoall/row"].bytes / 125e6 + 2 * 1e-3
                                                       + 3000 * 64 / 4 * 1e-9, rel=1e-12)
    # a table every step reads whole (u = V) is cheapest dense: nothing sparse about it
    full = Sparsity(rows=1000, dim=64, elem=4, k=1000, u=1000, u_host=1000, late=1.0, fed=False)
    assert choose(estimate(full, 8, 8, link, 0.0, schedule=False), ("dense", "allgather", "ps", "alltoall")) in (
        "dense", "alltoall/row", "alltoall/column")
    assert choose(estimate(full, 8, 8, link, 0.0), ("dense", "allgather", "ps")) == "dense"


def test_a_table_read_with_the_same_ids_follows_the_one_before():
    """The sampled softmax reads its weight and then its bias with one ids tensor: measured, the bias follows the
    weight, and is priced with the weight's route where the weight is split by columns and neither is fetched
    ahead (a fetch ahead keeps its route to itself)."""
    m = LSTMLM(vocab_size=300, dim=8, hidden=16, softmax="sampled", num_sampled=10)
    found = {t.name: t for t in find_tables(m)}
    x = torch.randint(0, 300, (4, 6))
    measure(m, list(found.values()), [(x, x.roll(1, 1)), (x.flip(0), x)])
    assert {n: t.route_from for n, t in found.items()} == {"embedding": None, "head.weight": None,
                                                           "head.bias": "head.weight"}
    bias, weight = found["head.bias"], found["head.weight"]
    for option, schedule, prefetch_all, want in [("alltoall/column", True, False, True),
                                                 ("alltoall/row", True, False, False), ("ps", True, False, False),
                                                 ("alltoall/column", True, True, False),
                                                 ("alltoall/column", False, True, True)]:
        got = follows(bias, {"head.weight": (option, weight)}, schedule, prefetch_all)
        assert got == want, (option, schedule, prefetch_all)
    assert not follows(bias, {}, True, False) and not follows(weight, {"embedding": ("alltoall/column", weight)},
                                                               True, False)


def test_clock_hidden_share():
    c = Clock()
    with c.inside():
        c.sync(lambda: None, "ids")

    class Done:
        def __init__(self):
            self.f = torch.futures.Future()

        def get_future(self):
            return self.f

        def wait(self):
            self.f.wait()

    w = c.launch(Done())
    w.f.set_result(None)
    with c.inside(), c.inside():  # nested calls count once
        c.wait(w, "rows")
    busy, waited, work = c.take()
    assert busy >= 0 and set(waited) == {"ids", "rows"} and work >= 0 and c.take() == (0.0, {}, 0.0)


def check_narrow_column_split():
    model = Bag(rows=10, dim=1).double()
    batch = (torch.tensor([[0, 1, 2]]), torch.zeros(1, dtype=torch.float64))
    with pytest.raises(PlanError, match="split auto"):
        sparse.shard(model, [batch], "alltoall", "sgd", split="column")
    tables = sparse.shard(model, [batch], "alltoall", "sgd", split="auto")  # a 1-wide table goes by rows
    return tables.tables["emb"].split


def test_column_split_needs_a_column_per_rank(world2):
    assert world2.run(check_narrow_column_split) == ["row", "row"]
