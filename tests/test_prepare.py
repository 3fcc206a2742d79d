"""tessel.prepare: a plain loop written here (not a tessel model) equals its single-process run to 1e-10.

Per case: embedding + EmbeddingBag + MLP in fp64, an LR schedule, clipping that bites, 5 steps; trained once
without tessel on the whole global batch, once prepared on this world's ranks; every parameter and every
table row compared. Plus the one-line errors and the resumable loader position.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tessel
from tessel import TesselError, comm
from tessel.data.prepared import PreparedLoader, slice_batch
from tessel.plan import ParallelPlan, TablePolicy
from tessel.prepare import _table_groups
from tessel.prepare import _table_policy as _plan
from tessel.sparse import find_tables
from tessel.sparse.rowopt import mirror

STEPS, BATCH, CLIP = 5, 8, 0.05


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(50, 6)
        self.tags = nn.EmbeddingBag(30, 6, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 5))

    def forward(self, words, tags, y):  # words (B, 4), tags (B, 3), y (B,)
        h = torch.cat([self.words(words).mean(1), self.tags(tags)], 1)
        return F.cross_entropy(self.mlp(h), y)


def _batches(n=STEPS):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 50, (BATCH, 4), generator=g), torch.randint(0, 30, (BATCH, 3), generator=g),
             torch.randint(0, 5, (BATCH,), generator=g)) for _ in range(n)]


def _setup(opt_name):
    torch.manual_seed(3)
    model = Plain().double()
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.5),
           "sgd-fused": lambda p: torch.optim.SGD(p, lr=0.5, fused=True),
           "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.3)}[opt_name](model.parameters())
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))


def _loop(model, opt, sched, loader, clip):
    losses = []
    for words, tags, y in loader:
        loss = model(words, tags, y)
        loss.backward()
        clip(model, CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.detach())
    return losses


def _torch_clip(model, max_norm):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _full(prepared):
    """name -> whole tensor: dense parameters, and each served table gathered from its owners (a sharded model:
    what tessel.unwrap gives back, each weight gathered from its shards)."""
    if prepared.shards is not None:
        return dict(tessel.unwrap(prepared).named_parameters())
    out = {n.removeprefix("module."): p.detach() for n, p in prepared.module.named_parameters()}
    out.update({k: v for k, v in prepared.tables.state_dict().items() if not k.startswith("state.")})
    return out


def check_parity(cases):
    p, r = dist.get_world_size(), dist.get_rank()
    for plan, opt_name in cases:
        ref, ref_opt, ref_sched = _setup(opt_name)
        ref_losses = _loop(ref, ref_opt, ref_sched, _batches(), _torch_clip)
        model, opt, sched = _setup(opt_name)
        # on a 0.1 Mbit/s link bytes dominate, so the cost model serves these small tables by rows (at 1 Gbit/s
        # it keeps them dense; near 10 Mbit/s its choice turns on the measured compute time, which load changes)
        model, opt, loader = tessel.prepare(model, opt, _batches(), plan=plan, link_mbit=0.1, verbose=False)
        losses = _loop(model, opt, sched, loader, tessel.clip_grad_norm_)
        want = dict(ref.named_parameters())
        got = _full(model)
        assert set(got) == set(want), (plan, sorted(got))
        for n, w in want.items():
            assert torch.allclose(got[n], w.detach(), atol=1e-10, rtol=0), (plan, opt_name, n)
        # each rank's loss is its slice's mean; their mean is the global batch's
        mean = torch.stack(losses)
        dist.all_reduce(mean)
        assert torch.allclose(mean / p, torch.stack(ref_losses), atol=1e-10, rtol=0), (plan, opt_name)
        if isinstance(plan, ParallelPlan):  # sharded: each rank keeps its share of the dense weights
            held = sum(p.to_local().numel() for p in model.module.parameters())
            assert held < sum(p.numel() for p in model.module.parameters())
            assert set(model.tables.strategies().values()) == {plan.sparse.strategy.name}
        if plan in ("ps", "alltoall"):
            assert set(model.tables.strategies().values()) == {plan}
        if plan == "alltoall":  # the input table fetched ahead; tags, fed by the second tensor, not unless asked
            assert {n: (t.lookahead, t.feed) for n, t in model.tables.tables.items()} == {"words": (True, 0),
                                                                                          "tags": (False, 1)}
        if plan == "auto":
            assert model.tables.strategies(), "auto served no table: the case would test plain DDP only"
        assert loader.state_dict() == {"position": 0, "steps": STEPS}  # the pass is over
        with torch.no_grad():  # an evaluation forward between steps: this rank's slice, the trained weights
            mine = slice_batch(_batches()[0], r, p)
            assert torch.allclose(model(*mine), ref(*mine), atol=1e-10, rtol=0), (plan, opt_name)
            held = ref(*_batches(STEPS + 1)[-1])  # a batch no step trained on, whole
        # the same call as under pp/tp: a held-out batch's slices, each rank's loss averaged, on every rank
        (words, tags, y), = loader.sliced([_batches(STEPS + 1)[-1]])
        assert torch.allclose(model.evaluate(words, tags, y), held, atol=1e-10, rtol=0), (plan, opt_name)
        assert model.training  # evaluate's eval mode ends with it
        assert [len(g["params"]) for g in opt.param_groups] == [6 - len(model.tables.tables)]  # served: gone
    return r


CASES = [("ps", "sgd"), ("alltoall", "adagrad"), ("auto", "adagrad"), ("ps", "adagrad"), ("alltoall", "sgd"),
         ("dense", "sgd")]


def test_prepared_plain_loop_equals_single_process_at_2_ranks(world2):
    assert world2.run(check_parity, CASES) == [0, 1]


def test_prepared_plain_loop_equals_single_process_at_4_ranks(world4):
    assert world4.run(check_parity, [("ps", "adagrad"), ("alltoall", "sgd"), ("auto", "sgd")]) == [0, 1, 2, 3]


def _sharded(dp: int, shard: int, strategy: str) -> ParallelPlan:
    return ParallelPlan(dp=dp, dp_shard=shard, sparse=TablePolicy(strategy=strategy, max_touched=1.0))


def test_prepared_loop_sharded_equals_single_process(world4):
    """plan=ParallelPlan(dp_shard=...): the loop's model under FSDP (the Sequential's layers each a unit, then the
    root), the user's optimizer stepping the shards, tessel.clip_grad_norm_ summing over them, tables still served
    by rows; FSDP over 4 ranks and HSDP 2 x 2 (two replicas of a 2-way shard); a user's fused optimizer (torch's
    fused SGD has no DTensor rule) steps the shards one tensor at a time."""
    cases = [(_sharded(4, 4, "ps"), "adagrad"), (_sharded(4, 2, "alltoall"), "sgd"),
             (_sharded(4, 4, "ps"), "sgd-fused")]
    assert world4.run(check_parity, cases) == [0, 1, 2, 3]


def _accumulating(model, opt, sched, loader, clip, pattern, k=2):
    """Gradient accumulation as users write it: ``chunks`` splits each batch into k forwards, ``batches`` takes k
    of the loader's batches per optimizer step (the scheduled tables fetch the next one during each), ``no_sync``
    as ``batches`` with all but a step's last forward and backward under ``model.no_sync()`` (DDP's idiom; a plain
    module has none). Returns each optimizer step's loss, the sum of its forwards' (a rank's chunk is not the global
    batch's: only sums compare), and the unique ids its forwards looked up in both tables."""
    losses, total, looked_up = [], 0.0, 0
    for i, (words, tags, y) in enumerate(loader):
        h = words.shape[0] // k
        # the loader's own tensors, not views of them, so that ``batches`` takes the fetched-ahead path
        parts = [(words[c * h:(c + 1) * h], tags[c * h:(c + 1) * h], y[c * h:(c + 1) * h]) for c in range(k)]
        quiet = pattern == "no_sync" and (i + 1) % k and hasattr(model, "no_sync")
        for part in parts if pattern == "chunks" else [(words, tags, y)]:
            with model.no_sync() if quiet else contextlib.nullcontext():
                loss = model(*part) / k
                loss.backward()
            looked_up += part[0].unique().numel() + part[1].unique().numel()
            total = total + loss.detach()
        if pattern != "chunks" and (i + 1) % k:
            continue
        clip(model, CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(total)
        total = 0.0
    return losses, looked_up


def check_accumulation(cases):
    p = dist.get_world_size()
    for plan, opt_name, pattern in cases:
        ref, ref_opt, ref_sched = _setup(opt_name)
        ref_losses, _ = _accumulating(ref, ref_opt, ref_sched, _batches(6), _torch_clip, pattern)
        model, opt, sched = _setup(opt_name)
        model, opt, loader = tessel.prepare(model, opt, _batches(6), plan=plan, link_mbit=0.1, verbose=False)
        comm.counter.reset()
        losses, looked_up = _accumulating(model, opt, sched, loader, tessel.clip_grad_norm_, pattern)
        if plan == "alltoall":  # the path under test: the input table's rows fetched ahead of each forward
            assert model.tables.tables["words"].lookahead
            # each forward's unique rows reach this rank once, 3 columns of 8 bytes from the other rank (the
            # counter counts the wire, not a rank's own part), and their gradients leave it once: no row is fetched
            # for another forward or sent twice
            assert [(t.split, t.widths) for t in model.tables.tables.values()] == [("column", [3, 3])] * 2
            moved = comm.counter.total()
            assert moved["a2a.fwd"]["recv"] == moved["a2a.bwd"]["sent"] == looked_up * 3 * 8, (pattern, moved)
        if pattern != "chunks":  # the dense gradients reduced in every backward, or (no_sync) in a step's last only
            reductions, dense = {"batches": 6, "no_sync": 3}[pattern], list(ref.mlp.parameters())  # tables served
            if isinstance(plan, ParallelPlan):  # FSDP's reduce-scatter: each weight's dim 0 padded to p rows
                per, channel = sum(-(-w.shape[0] // p) * w[0].numel() for w in dense) * 8 * (p - 1), "dp.scatter"
            else:  # DDP's ring all-reduce
                per, channel = sum(w.numel() for w in dense) * 8 * 2 * (p - 1) / p, "dp.dense"
            assert comm.counter.total()[channel]["sent"] == reductions * per, (pattern, comm.counter.total())
        got = _full(model)
        for n, w in ref.named_parameters():
            assert torch.allclose(got[n], w.detach(), atol=1e-10, rtol=0), (plan, opt_name, pattern, n)
        mean = torch.stack(losses)
        dist.all_reduce(mean)
        assert torch.allclose(mean / p, torch.stack(ref_losses), atol=1e-10, rtol=0), (plan, opt_name, pattern)
    return True


def test_prepared_loop_accumulating_gradients_equals_single_process(world2):
    """Several forwards and backwards per optimizer step: each forward's rows are its own (a scheduled table's
    next-batch rows, fetched before the update that now comes later, are completed before that forward reads them),
    and the step reduces every forward's row gradients; ``model.no_sync()`` keeps the dense gradients (DDP's, or
    FSDP's unsharded ones) to the step's last backward."""
    cases = [("alltoall", "sgd", "chunks"), ("alltoall", "adagrad", "batches"), ("ps", "adagrad", "chunks"),
             ("auto", "sgd", "batches"), ("alltoall", "sgd", "no_sync"), ("ps", "adagrad", "no_sync"),
             (_sharded(2, 2, "alltoall"), "sgd", "no_sync")]
    assert world2.run(check_accumulation, cases) == [True, True]


def test_one_process_without_launch_runs_the_loop_unchanged():
    ref, ref_opt, ref_sched = _setup("adagrad")
    want = _loop(ref, ref_opt, ref_sched, _batches(), _torch_clip)
    model, opt, sched = _setup("adagrad")
    model, opt, loader = tessel.prepare(model, opt, _batches())
    got = _loop(model, opt, sched, loader, tessel.clip_grad_norm_)
    assert torch.allclose(torch.stack(got), torch.stack(want), atol=1e-12, rtol=0)  # norms summed in another order


def _chunked(model, opt, data, k, p=1):
    """k forwards and backwards a step (gradient accumulation), each drawing its own candidates. Forward c takes
    part c of each of the batch's p rank slices (one process, ``p`` the ranks: the rows the ranks' forward c take,
    with the draw they share; prepared, p=1: the loader's slice is this rank's)."""
    for x, y in data:
        xs, ys = x.chunk(p * k), y.chunk(p * k)  # (rank slice r, part c) is chunk r * k + c
        for c in range(k):
            part = [r * k + c for r in range(p)]
            (model(torch.cat([xs[i] for i in part]), torch.cat([ys[i] for i in part])) / k).backward()
        opt.step()
        opt.zero_grad()


def check_sampled_evaluate(cases):
    """A sampled softmax trained with its tables served (one forward a step, or two accumulated), then evaluated:
    in eval mode it runs the full softmax, which reads the whole output table (gathered for the evaluation from
    its owners, dropped after)."""
    from tessel.models import LSTMLM

    def setup():
        torch.manual_seed(3)
        m = LSTMLM(vocab_size=300, dim=8, hidden=16, softmax="sampled", num_sampled=10).double()
        return m, torch.optim.SGD(m.parameters(), lr=0.5)

    g = torch.Generator().manual_seed(5)
    data = [(torch.randint(0, 300, (4, 6), generator=g), torch.randint(0, 300, (4, 6), generator=g)) for _ in range(4)]
    held = data.pop()
    for strategy, k in cases:
        ref, ref_opt = setup()
        _chunked(ref, ref_opt, data, k, dist.get_world_size())
        ref.eval()
        with torch.no_grad():
            want = ref(*held)
        model, opt = setup()
        model, opt, loader = tessel.prepare(model, opt, data, plan=strategy, link_mbit=0.1, verbose=False)
        _chunked(model, opt, loader, k)
        assert set(model.tables.strategies().values()) == {strategy}, model.tables.strategies()
        for n, w in ref.named_parameters():  # the candidates each forward drew were the same on every rank
            assert torch.allclose(_full(model)[n], w.detach(), atol=1e-10, rtol=0), (strategy, k, n)
        (x, y), = loader.sliced([held])
        comm.counter.reset()
        assert torch.allclose(model.evaluate(x, y), want, atol=1e-10, rtol=0), strategy
        # the output table and its bias cross once, each rank's part (padded to the largest) to the other rank:
        # rows for a row split (ps, or alltoall by rows), columns for a column split; fp64
        p, gathered = dist.get_world_size(), 0
        for name, d in (("head.weight", 8), ("head.bias", 1)):
            t = model.tables.tables[name]
            if getattr(t, "split", "row") == "row":
                gathered += (p - 1) * max(t.plan.counts) * d * 8
            else:
                gathered += (p - 1) * 300 * max(t.widths) * 8
        moved = comm.counter.total()
        assert sum(moved.get(c, {"sent": 0})["sent"] for c in ("ps.gather", "a2a.gather")) == gathered, moved
        head = model.tables.tables["head.weight"]
        assert head.gathered is None and not head.evaluating  # whole only during the evaluation
        with pytest.raises(AttributeError, match=rf"'head.weight' is spread over 2 ranks \(strategy {strategy}\)"):
            head.weight  # noqa: B018 - the property is what is tested
    return True


def test_sampled_softmax_with_served_tables_trains_accumulates_and_evaluates_on_the_whole_table(world2):
    assert world2.run(check_sampled_evaluate, [("alltoall", 1), ("ps", 1), ("alltoall", 2), ("ps", 2)]) == [True] * 2


def test_evaluate_wants_a_loss_in_one_line():
    class Logits(Plain):
        def forward(self, words, tags, y):
            return self.mlp(torch.cat([self.words(words).mean(1), self.tags(tags)], 1))

    model = Logits().double()
    model, _, loader = tessel.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches(1), verbose=False)
    with pytest.raises(TesselError, match=r"evaluate needs the model to return its loss .*; it returned Tensor$"):
        model.evaluate(*_batches(1)[0])


def test_loader_slices_and_resumes_its_position():
    data = [torch.arange(8) + 10 * i for i in range(4)]
    loader = PreparedLoader(data, 1, 2)
    it = iter(loader)
    assert torch.equal(next(it), torch.tensor([4, 5, 6, 7]))
    assert torch.equal(loader.next_inputs, torch.tensor([14, 15, 16, 17]))  # peeked for the next step's rows
    next(it)
    state = loader.state_dict()
    resumed = PreparedLoader(data, 1, 2)
    resumed.load_state_dict(state)
    assert [t.tolist() for t in resumed] == [[24, 25, 26, 27], [34, 35, 36, 37]]
    assert [t.tolist() for t in resumed][0] == [4, 5, 6, 7]  # the next pass starts from the top
    assert resumed.state_dict() == {"position": 0, "steps": 8}  # between passes: resume at the next start


def test_bad_input_is_one_line_each():
    m = Plain()
    cases = [
        (lambda: slice_batch({"x": "text"}, 0, 2), "the loader yields dict"),  # dicts of tensors are batches
        (lambda: slice_batch((torch.zeros(4), torch.zeros(3)), 0, 2), "cannot be split over 2 ranks"),
        (lambda: slice_batch(torch.zeros(5), 0, 2), "a multiple of 2"),
        (lambda: mirror(torch.optim.RMSprop([torch.zeros(1, requires_grad=True)]), {}, False),
         "RMSprop cannot update table rows"),
        (lambda: mirror(torch.optim.Adam([torch.zeros(1, requires_grad=True)]), {}, False), "pass lazy=True"),
        (lambda: mirror(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), {"momentum": 0.9}, False),
         "pass lazy=True"),
        (lambda: mirror(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), {"nesterov": True}, True),
         "with nesterov cannot"),
        (lambda: _plan("ps", [], {}), "the model has no nn.Embedding"),
        (lambda: _plan("rows", ["words"], {}), "plan 'rows' is unknown; valid:"),
        (lambda: _plan({"words": "ps"}, ["words", "out"], {"words": ["out"]}), "table 'words' shares its weight"),
        (lambda: _plan(3, ["words"], {}), "is neither a strategy"),
        (lambda: _table_groups(m, torch.optim.SGD([{"params": m.words.parameters(), "lr": 0.1},
                                                   {"params": m.tags.parameters(), "lr": 0.2}]), find_tables(m)),
         "param groups [0, 1] with different settings"),
        (lambda: tessel.prepare(Plain(), torch.optim.SGD(Plain().parameters(), lr=1), _batches(), world=4),
         "prepare expected 4 ranks but runs on 1"),
        (lambda: tessel.prepare(Plain(), torch.optim.SGD(Plain().parameters(), lr=1), _batches(),
                                plan=ParallelPlan(dp=1, pp=2, dp_shard=2)), "dp_shard must divide dp"),
    ]
    for fn, text in cases:
        with pytest.raises(TesselError) as e:
            fn()
        assert text in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert mirror(torch.optim.Adam([torch.zeros(1, requires_grad=True)]), {"betas": (0.9, 0.99)}, True).kind == "adam"


def check_resume(tmp, plan):
    def train(model, opt, loader, stop=None):
        for words, tags, y in loader:
            model(words, tags, y).backward()
            tessel.clip_grad_norm_(model, CLIP)
            opt.step()
            opt.zero_grad()
            if loader.steps == stop:
                tessel.save(tmp, model, opt, loader)
                return
        return _full(model)

    model, opt, _ = _setup("adagrad")
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan=plan, link_mbit=1000, verbose=False)
    straight = train(model, opt, loader)
    model, opt, _ = _setup("adagrad")
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan=plan, link_mbit=1000, verbose=False)
    assert tessel.load(tmp, model, opt, loader) is None  # nothing saved yet
    train(model, opt, loader, stop=3)
    model, opt, _ = _setup("adagrad")
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan="allgather", link_mbit=1000, verbose=False)
    with pytest.raises(TesselError, match="was saved under plan: dp=2, pp=1, tp=1, 1 micro-batch, tables "):
        tessel.load(tmp, model, opt, loader)  # tables served otherwise than saved: refused, with the way out
    model, opt, _ = _setup("adagrad")
    # auto would decide afresh; resume= serves each table as the checkpoint did
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan="auto", link_mbit=1000, verbose=False,
                                        resume=tmp)
    assert tessel.load(tmp, model, opt, loader) == 3
    resumed = train(model, opt, loader)
    assert loader.steps == STEPS
    return all(torch.equal(resumed[n], straight[n]) for n in straight)


def test_prepared_loop_resumes_bit_identical(world2, tmp_path):
    for plan in ("ps", "alltoall"):
        assert world2.run(check_resume, str(tmp_path / plan), plan) == [True, True]


def check_resume_elsewhere(tmp, plan, stop):
    """Train ``stop`` steps and save (``stop``), or load what another rank count saved and train the rest."""
    model, opt, sched = _setup("adagrad")
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan=plan, link_mbit=0.1, verbose=False,
                                        resume=None if stop else tmp)
    if not stop:
        for _ in range(tessel.load(tmp, model, opt, loader)):  # the LR scheduler's state is the caller's
            sched.step()
    for words, tags, y in loader:
        model(words, tags, y).backward()
        tessel.clip_grad_norm_(model, CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
        if loader.steps == stop:
            tessel.save(tmp, model, opt, loader)
            return None
    return {n: t.tolist() for n, t in _full(model).items()}


def check_resume_refused(tmp, plan) -> str:
    model, opt, _ = _setup("adagrad")
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan=plan, link_mbit=0.1, verbose=False, resume=tmp)
    with pytest.raises(TesselError) as e:
        tessel.load(tmp, model, opt, loader)
    return str(e.value)


def test_prepared_loop_resumes_on_another_rank_count(world2, world4, tmp_path):
    """Saved on 2 ranks, resumed on 4 (and the other way round): the tables come back whole and are cut anew, the
    dense weights and their optimizer state are DCP's to reshard, each rank takes its new slice of the global batches
    from the saved position; the end equals one process trained straight through. A DDP checkpoint resumed under
    FSDP is refused in one line."""
    ref, ref_opt, ref_sched = _setup("adagrad")
    _loop(ref, ref_opt, ref_sched, _batches(), _torch_clip)
    for (plan, first), (again, then) in [(("alltoall", world2), ("alltoall", world4)),
                                         (("ps", world4), ("ps", world2)),
                                         ((_sharded(2, 2, "alltoall"), world2), (_sharded(4, 4, "alltoall"), world4))]:
        tmp = str(tmp_path / f"{first.size}-{plan if isinstance(plan, str) else 'fsdp'}")
        assert first.run(check_resume_elsewhere, tmp, plan, 3) == [None] * first.size
        got = then.run(check_resume_elsewhere, tmp, again, 0)
        for n, w in ref.named_parameters():
            for r in range(then.size):
                assert torch.allclose(torch.tensor(got[r][n], dtype=torch.float64), w.detach(), atol=1e-10,
                                      rtol=0), (plan, n, r)
    said = world4.run(check_resume_refused, str(tmp_path / "2-alltoall"), _sharded(4, 4, "alltoall"))
    assert all("was saved under plan: dp=2" in m and "\n" not in m for m in said), said


def test_prepare_example_runs_under_tessel_run(tmp_path):
    """examples/prepare_loop.py (the README's snippet) on 2 workers started by `tessel run`."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "prepare_loop.py"
    r = subprocess.run([sys.executable, "-m", "tessel", "run", "--nproc", "2", str(example), "ps"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("-> ps (sparse)") == 2, r.stdout  # both tables served by rows
    mlp = (32 * 64 + 64) + (64 + 1)  # Linear(32, 64) and Linear(64, 1), fp64
    assert f"'dp.dense': {mlp * 8}," in r.stdout  # ring all-reduce over 2 ranks: 2(P-1)/P = 1x the gradient
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", r.stdout).groups())
    assert last < first - 0.05
