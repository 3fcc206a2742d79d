"""Mixed precision (``train.precision bf16-mixed``): the distributed run against one process in bf16-mixed, the bytes
of every channel at its width, and checkpoints that resume in either precision.

Tolerance (written here, not tuned): a bf16-mixed run is the fp32 computation with its GEMMs' inputs and outputs
rounded to bf16 (8 significant bits). The distributed run and the single process round at different places (a
stage boundary, a partial sum before it crosses, another GEMM blocking), each rounding changing a value by at most
2^-9 of it, as often as the single process rounds. So each run's distance from the fp32 run is the effect of bf16's
rounding on this model and trajectory; by the triangle inequality the two bf16 runs are at most the sum of their
distances from fp32 apart, and allowing the distributed run's distance to be twice the single process's (it rounds
at the boundaries too) gives ``3 x |bf16 - fp32|``, for the loss of every step and for every fp32 master after the
steps. That distance is not a fixed size but one draw: at SGD lr 0.5 a 5-step trajectory turns a flipped rounding
into a different path, and one flip follows from a last-bit change of an fp32 sum. So the yardstick is the largest of
two draws the single process makes: the compared run itself, and a run that rounds at every product, attention's
included, as autocast does (on CPU tessel computes attention in fp32, tessel/models/attention.py). Fewer places to
round do not mean a shorter distance: on a CPU without AVX-512 (2026-12-06, AMD EPYC, AVX2) the compared run ended
1.69e-3 from fp32 in loss on dp2's model and the every-product run 5.5e-4, the reverse of an AVX-512 machine's
order, where the fp32 attention sums its terms in another order (a yardstick of the second draw alone failed dp2
and 3-D there, at 3.7x and 3.1x it).
A dropped gradient, a wrong scale or a stale weight moves a run by a share of the gradient, far above that: with
SGD, whose update is linear in the gradient, a learning rate 10% off moves the one-process weights 23-27x and its
losses 35-200x further than bf16 does (measured on these cases), and the distributed run with it lands at 5.3-9.7x
the bound in weights and 9.1-23x in loss, where the runs as they are stay at 0.17-0.40 of it (dp2, dp2-ps, pp2,
tp2 1-D, 3-D, dp2 x tp2 with ps; 2026-12-06, on the AVX2 machine above). An optimizer that normalizes (Adam,
Adagrad) turns the rounding of a tiny gradient into a sign flip of a whole step, which would hide a bug of that size:
SGD here.
"""

from unittest import mock

import pytest
import torch
import torch.distributed as dist

from composed import planned
from steps import TorchReference
from tessel import comm
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.train.build import build, build_data

B, STEPS, SLACK = 8, 5, 3.0
MODEL = ["model.name=transformer_lm", "model.dim=32", "model.layers=2", "model.heads=2", "data.vocab_size=128",
         "data.seq_len=16", f"train.global_batch={B}", "train.optimizer=sgd", "train.lr=0.5", "train.warmup=1",
         "train.clip=1.0", "sparse.max_touched=1.0", "train.steps=5"]
LAYOUTS = {
    "dp2": ["parallel.dp=2", "sparse.strategy=dense"],
    "dp2-ps": ["parallel.dp=2", "sparse.strategy=ps", "train.momentum=0"],
    "dp2-alltoall": ["parallel.dp=2", "sparse.strategy=alltoall", "train.momentum=0"],
    "pp2-1f1b": ["parallel.pp=2", "pipeline.split=2,2", "train.micro_batches=2"],
    "tp2-1d": ["parallel.tp=2", "tensor.mode=1d"],
    "tp4-3d": ["parallel.tp=4", "tensor.mode=3d", "tensor.grid=2x2x1"],
    "dp2-pp2-tp2": ["parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "tensor.mode=1d", "pipeline.split=2,2",
                    "train.micro_batches=2"],
    "dp2-pp2-ps": ["parallel.dp=2", "parallel.pp=2", "pipeline.split=2,2", "train.micro_batches=2",
                   "sparse.strategy=ps", "train.momentum=0"],
    "dp2-tp2-ps": ["parallel.dp=2", "parallel.tp=2", "tensor.mode=1d", "sparse.strategy=ps", "train.momentum=0"],
    "dp2-pp2-alltoall": ["parallel.dp=2", "parallel.pp=2", "pipeline.split=2,2", "train.micro_batches=2",
                         "sparse.strategy=alltoall", "train.momentum=0"],
    # dp gradients reduced in bf16 (asked for): tessel's DDP hook, FSDP's reduce-scatter, a pipeline's step tail
    # (torch's own bf16 hook runs on NCCL only)
    "dp2-bf16-reduce": ["parallel.dp=2", "sparse.strategy=dense", "parallel.grad_reduce=bf16"],
    "dp2-shard-bf16-reduce": ["parallel.dp=2", "parallel.dp_shard=2", "sparse.strategy=dense",
                              "parallel.grad_reduce=bf16"],
    "dp2-pp2-bf16-reduce": ["parallel.dp=2", "parallel.pp=2", "pipeline.split=2,2", "train.micro_batches=2",
                            "parallel.grad_reduce=bf16"],
}


def _rows_cross_in_bf16(module, args, out):
    """What serving a table does under bf16-mixed: the looked-up rows cross the wire in bf16, so the forward sees
    them rounded; their gradient is the fp32 one (straight through the rounding)."""
    return out + (out.to(torch.bfloat16).to(out.dtype) - out).detach()


def _reference(overrides: list[str], precision: str):
    """One process, a plain torch loop (autocast for bf16-mixed, and the tables' rows rounded to bf16 where the run
    serves them, as the precision policy says they cross): losses per step and the weights after."""
    cfg = load_config(None, [*MODEL, *overrides])
    data = build_data(cfg)
    torch.manual_seed(1)
    model = build(cfg, data.vocab_size)
    if precision == "bf16-mixed" and cfg.sparse.strategy in ("ps", "alltoall"):
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding):
                m.register_forward_hook(_rows_cross_in_bf16)
    ref = TorchReference(model, cfg.train, torch.bfloat16 if precision == "bf16-mixed" else None)
    loader, losses = ShardedLoader(data, B, 0, 1), []
    for step in range(STEPS):
        x, y = loader.next_batch()
        losses.append(ref.step(x, y, step).loss)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def run(overrides: list[str], precision: str):
    """The composed run on this world: (losses seen by the rank holding the last stage, dp-averaged, or None; this
    rank's weights as blocks of the plain ones: name -> (tensor, the grid's split or None); bytes per channel)."""
    cfg = load_config(None, [*MODEL, *overrides, f"train.precision={precision}"])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    model = build(cfg, data.vocab_size)
    dp = mesh.get_local_rank("dp")
    peek = ShardedLoader(data, B, dp, plan.dp)
    par = parallelize(model, plan, mesh, [peek.next_batch(), peek.next_batch()], settings)
    loader, losses = ShardedLoader(data, B, dp, plan.dp), []
    comm.counter.end_step()
    for step in range(STEPS):
        x, y = loader.next_batch()
        res = par.engine.step(x, y, step, loader.peek())
        loss = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(loss, "meta", group=mesh.get_group("dp"))
        losses.append(float(loss) / plan.dp)
    par.engine.drain(STEPS)
    sent = {c: v["sent"] for c, v in comm.counter.end_step().items()}
    local = {}
    for n, p in par.module.named_parameters():
        if hasattr(p, "full_tensor"):  # an FSDP shard (a DTensor): the whole weight, gathered on every rank
            p = p.full_tensor()
        local[n] = (p.detach().clone(), getattr(p, "tp_split", None))
    if par.tables:
        from tessel import sparse

        # under tp a served token table is this tp rank's vocabulary rows (from lo), served over the dp group
        from tessel.tensor.layers import TPEmbedding

        first = {id(m.table): m.lo for m in par.module.modules() if isinstance(m, TPEmbedding) and m.table is not None}
        for n, t in par.tables.tables.items():
            local[f"{n}.weight"] = (sparse.full_table(t), ("rows", first[id(t)]) if id(t) in first else None)
    last = par.engine.computes_loss
    return (losses if last else None), local, sent, par.shards.grid.coords if par.shards else None, plan.tp_mode


def _blocks(full: torch.Tensor, split, coords, mode, shape):
    """This rank's block of a full tensor, cut as the rank's split says (the grid rebuilt from coordinates)."""
    from tessel.tensor.grid import Grid, GridSpec

    if split is None:
        return full
    if isinstance(split, tuple):  # ("rows", lo): a served table's vocabulary rows from lo, as many as shape says
        return full[split[1]:split[1] + shape[0]]
    grid = Grid(GridSpec(mode, shape))
    grid.coords = coords
    return grid.local(full, split)


def _tolerances(overrides):
    bf16, fp32 = _reference(overrides, "bf16-mixed"), _reference(overrides, "fp32")
    with mock.patch("tessel.models.attention._widened", lambda q: False):  # every product rounds: the second draw
        every = _reference(overrides, "bf16-mixed")
    draws = (bf16, every)  # two single-process draws of bf16's distance from fp32 (module docstring)
    loss_gap = max(abs(a - b) for run in draws for a, b in zip(run[0], fp32[0]))
    weight_gap = max(float((run[1][n] - fp32[1][n]).abs().max()) for run in draws for n in run[1])
    return bf16, SLACK * loss_gap, SLACK * weight_gap


@pytest.mark.parametrize("layout", ["dp2", "dp2-ps", "dp2-alltoall", "pp2-1f1b", "tp2-1d", "dp2-bf16-reduce",
                                    "dp2-shard-bf16-reduce"])
def test_bf16_mixed_equals_one_process_in_bf16_mixed_within_bf16s_rounding(world2, layout):
    _check(world2, layout)


@pytest.mark.parametrize("layout", ["tp4-3d", "dp2-pp2-ps", "dp2-pp2-alltoall", "dp2-tp2-ps",
                                    "dp2-pp2-bf16-reduce"])
def test_bf16_mixed_on_4_ranks(world4, layout):
    _check(world4, layout)


def test_bf16_mixed_dp2_pp2_tp2(world8):
    _check(world8, "dp2-pp2-tp2")


def _check(world, layout):
    overrides = LAYOUTS[layout]
    (ref_losses, ref_weights), tol_loss, tol_w = _tolerances(overrides)
    assert tol_loss > 0 and tol_w > 0  # bf16 really rounds: the reference runs differ
    shape = _grid_shape(overrides)
    for losses, local, _, coords, mode in world.run(run, overrides, "bf16-mixed"):
        if losses is not None:
            worst = max(abs(a - b) for a, b in zip(losses, ref_losses))
            assert worst <= tol_loss, (layout, losses, ref_losses, tol_loss)
        for n, (t, split) in local.items():
            mine = _blocks(ref_weights[n], split, coords, mode, t.shape if isinstance(split, tuple) else shape)
            assert float((t - mine).abs().max()) <= tol_w, (layout, n, float((t - mine).abs().max()), tol_w)


def _grid_shape(overrides):
    cfg = load_config(None, [*MODEL, *overrides])
    plan, _ = planned(cfg, cfg.nproc)
    return plan.tp_grid


def test_bf16_mixed_bytes_per_channel_are_the_formulas_at_their_widths(world2):
    """Exact bytes of one bf16-mixed step, from the shapes: what crosses in bf16 counts 2 bytes an element.

    - pp2 (2 micro-batches of B/2 sequences of T tokens, width D): each micro-batch's boundary activation goes
      forward and its gradient back, 2 bytes an element (fp32: 4);
    - tp2 1-D: per block four sums of the (B·T, D) activation (q/k/v's input gradient, out_proj's output, fc_in's
      input gradient, fc_out's output), each a ring's 2(P-1)/P of 2-byte elements; the loss's per-row sums and the
      norm statistics stay fp32 on channels of their own;
    - dp2 with a ps table: the rows pulled and their gradients pushed back cross in bf16 (ids 8 bytes): the test
      below, and tests/test_sparse.py and tests/test_alltoall.py for every strategy at both widths.
    """
    T, D = 16, 32
    pp = world2.run(run, LAYOUTS["pp2-1f1b"], "bf16-mixed")
    act = (B // 2) * T * D  # one micro-batch's boundary activation, elements
    assert pp[0][2]["pp"] == STEPS * 2 * act * 2 and pp[1][2]["pp"] == STEPS * 2 * act * 2, pp[0][2]
    tp = world2.run(run, LAYOUTS["tp2-1d"], "bf16-mixed")
    ring = 2 * (2 - 1) / 2
    assert tp[0][2]["tp"] == STEPS * 2 * 4 * ring * B * T * D * 2, tp[0][2]  # 2 blocks x 4 sums
    fp32 = world2.run(run, LAYOUTS["tp2-1d"], "fp32")
    assert fp32[0][2]["tp"] == 2 * tp[0][2]["tp"]
    # the figure a run's summary prints beside its measured tp bytes (the bench's tensor table) is the same count
    from tessel.tensor.cost import step_formula

    cfg = load_config(None, [*MODEL, *LAYOUTS["tp2-1d"]])
    plan, _ = planned(cfg, cfg.nproc)
    assert step_formula(cfg, plan, 2)["tp_bytes_per_step"] * STEPS == tp[0][2]["tp"]
    assert step_formula(cfg, plan, 4)["tp_bytes_per_step"] * STEPS == fp32[0][2]["tp"]


def test_bf16_mixed_3d_blocks_cross_at_half_width(world4):
    """3-D tensor parallelism (2x2x1) in bf16-mixed: every collective of the blocks' linears on channel ``tp`` moves
    a GEMM's bf16 operand or its bf16 partial sums (gathers of x and w, reduce-scatters of y, dx and dw, the sums
    accumulating in fp32 on arrival), so the channel carries exactly half the bytes of the fp32 run, step for step,
    and the count the run's summary prints beside it (``step_formula`` at 2 bytes) is the same."""
    from tessel.tensor.cost import step_formula

    half = world4.run(run, LAYOUTS["tp4-3d"], "bf16-mixed")
    full = world4.run(run, LAYOUTS["tp4-3d"], "fp32")
    cfg = load_config(None, [*MODEL, *LAYOUTS["tp4-3d"]])
    plan, _ = planned(cfg, cfg.nproc)
    for h, f in zip(half, full):
        assert 2 * h[2]["tp"] == f[2]["tp"] > 0, (h[2], f[2])
    assert step_formula(cfg, plan, 2)["tp_bytes_per_step"] * STEPS == half[0][2]["tp"]


def test_bf16_gradient_reduce_halves_the_dp_bytes(world2, world4):
    """Asked for, DDP's gradients (and a pipeline stage's, averaged in the step tail) cross in bf16: an all-reduce
    over P ranks sends 2(P-1)/P of the model's N parameters, 2 bytes each, every step (fp32: 4)."""
    cfg = load_config(None, MODEL)
    n = sum(p.numel() for p in build(cfg, build_data(cfg).vocab_size).parameters())
    ring = 2 * (2 - 1) / 2
    for overrides in (LAYOUTS["dp2-bf16-reduce"], LAYOUTS["dp2"]):
        elem = 2 if "parallel.grad_reduce=bf16" in overrides else 4
        for _, _, sent, _, _ in world2.run(run, overrides, "bf16-mixed"):
            assert sent["dp.dense"] == STEPS * ring * n * elem, (overrides, sent["dp.dense"], n)
    # two stages of 2 blocks each (the first holds the token table, the last the head and final norm): each dp
    # pair averages its stage's parameters
    half = world4.run(run, LAYOUTS["dp2-pp2-bf16-reduce"], "bf16-mixed")
    assert sum(r[2]["dp.dense"] for r in half) == 2 * STEPS * ring * n * 2, [r[2]["dp.dense"] for r in half]
    # sharded (FSDP over 2): each unit's gradients reduce-scattered with bf16 terms, half the bytes of full width;
    # the weights' gathers cross in bf16 under bf16-mixed either way
    shard = ["parallel.dp=2", "parallel.dp_shard=2", "sparse.strategy=dense"]
    full = world2.run(run, shard, "bf16-mixed")
    half = world2.run(run, [*shard, "parallel.grad_reduce=bf16"], "bf16-mixed")
    for f, h in zip(full, half):
        assert f[2]["dp.scatter"] == 2 * h[2]["dp.scatter"] > 0 and f[2]["dp.gather"] == h[2]["dp.gather"], (f[2], h[2])


def check_row_bytes() -> dict:
    """A ps table whose rows cross in bf16 (fp32 table): known ids on 2 ranks, rows owned alternately."""
    from tessel import sparse
    from test_sparse import Bag

    r = dist.get_rank()
    torch.manual_seed(0)
    model = Bag(rows=10, dim=3)
    ids = [torch.tensor([[0, 1, 2, 2, 5]]), torch.tensor([[1, 3, 3, 4, 4]])][r]
    y = torch.zeros(1)
    tables = sparse.shard(model, [(ids, y)], "ps", "sgd", lr=0.1, partitions=2)
    tables.tables["emb"].wire = torch.bfloat16  # as serve(..., wire=bf16) sets it under bf16-mixed
    comm.counter.end_step()
    model(ids, y).backward()
    forward = comm.counter.end_step()
    tables.reduce()
    return {"forward": forward, "reduce": comm.counter.end_step()}


def test_bf16_rows_are_pulled_and_pushed_at_half_width(world2):
    # rank 0 wants {0,1,2,5}: 1 and 5 live on rank 1; rank 1 wants {1,3,4}: 4 lives on rank 0 (ids: 8 bytes)
    got = world2.run(check_row_bytes)
    pulled = pushed = 3 * 2  # a row of 3 of an fp32 table: out in bf16, its gradient back in bf16
    assert got[0]["forward"]["ps.pull"] == {"sent": 2 * 8 + 1 * pulled, "recv": 1 * 8 + 2 * pulled}
    assert got[1]["forward"]["ps.pull"] == {"sent": 1 * 8 + 2 * pulled, "recv": 2 * 8 + 1 * pulled}
    assert got[0]["reduce"]["ps.push"] == {"sent": 2 * (8 + pushed), "recv": 1 * (8 + pushed)}


def prepared(precision: str):
    """tessel.prepare's plain loop (dp2, the table served by ps) in ``precision``: losses, pull and push bytes."""
    import tessel
    from test_prepare import Plain, _batches

    torch.manual_seed(3)
    model = Plain()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan="ps", precision=precision, verbose=False)
    losses = []
    comm.counter.end_step()
    for words, tags, y in loader:
        loss = model(words, tags, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    sent = comm.counter.end_step()
    return losses, sent["ps.pull"]["sent"], sent["ps.push"]["sent"], {p.dtype for g in opt.param_groups
                                                                       for p in g["params"]}


def test_prepare_takes_a_precision(world2):
    bf16, fp32 = world2.run(prepared, "bf16-mixed"), world2.run(prepared, "fp32")
    for a, b in zip(bf16, fp32):
        assert a[0] != b[0] and max(abs(x - y) for x, y in zip(a[0], b[0])) < 0.05  # rounded, not another run
        assert a[1] < b[1]  # the pulled rows crossed at half width (the ids did not)
        assert a[3] == {torch.float32}  # the returned optimizer steps the fp32 masters
    for got in (bf16, fp32):
        # a pull moves each asked id out and its row back, a push the same ids with the rows' gradients: over the
        # world the two carry the same bytes when rows and gradients cross at one width
        assert sum(r[1] for r in got) == sum(r[2] for r in got), got


def prepared_reduce(grad_reduce: str) -> int:
    """tessel.prepare's plain loop on dp2 with the plan's gradient reduce: the dense gradients' bytes."""
    import tessel
    from tessel.plan import ParallelPlan
    from test_prepare import Plain, _batches

    torch.manual_seed(3)
    model = Plain()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt, loader = tessel.prepare(model, opt, _batches(), plan=ParallelPlan(dp=2, grad_reduce=grad_reduce),
                                        verbose=False)
    comm.counter.end_step()
    for words, tags, y in loader:
        model(words, tags, y).backward()
        opt.step()
        opt.zero_grad()
    return comm.counter.end_step()["dp.dense"]["sent"]


def test_prepare_reduces_gradients_in_bf16_when_asked(world2):
    full, half = world2.run(prepared_reduce, "full"), world2.run(prepared_reduce, "bf16")
    assert full == [2 * h for h in half] and half[0] > 0


def test_a_checkpoint_resumes_in_the_other_precision(world1, tmp_path):
    """Checkpoints hold the fp32 masters whatever the precision: an fp32 run's step-3 checkpoint resumed in
    bf16-mixed (and a bf16-mixed one's in fp32) goes on from the saved weights, saves fp32 again, and ends within
    bf16's own effect (the same 3x slack as above) of the uninterrupted run in the precision it resumed in. The
    summary and the checkpoint's tessel.json record the precision, and a resume in the other one says so."""
    import json
    import shutil

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from trained import train as trained

    flags = [f"--{kv.replace('=', ' ', 1)}" for kv in MODEL[:-1]]
    args = [*" ".join(flags).split(), "--nproc", "1", "--steps", "6", "--ckpt-every", "3", "--checkpoint.keep", "5",
            "--metrics.progress", "log"]

    def train(out, *extra):
        return trained(world1, tmp_path, *args, *extra, "--out", str(out))

    def weights(out, step):
        dst = tmp_path / f"{out.name}-{step}.pt"
        dcp_to_torch_save(str(out / "checkpoints" / f"step-{step:08d}"), str(dst))
        return torch.load(dst, weights_only=False)["model"]

    runs = {p: tmp_path / p for p in ("fp32", "bf16-mixed")}
    for p, out in runs.items():
        summary, _ = train(out, "--train.precision", p)
        assert summary["precision"] == p  # the run's record says what it computed in
        assert json.loads((out / "checkpoints" / "step-00000003" / "tessel.json").read_text())["precision"] == p
    for saved, resumed in (("fp32", "bf16-mixed"), ("bf16-mixed", "fp32")):
        out = tmp_path / f"{saved}-then-{resumed}"
        shutil.copytree(runs[saved] / "checkpoints" / "step-00000003", out / "checkpoints" / "step-00000003")
        _, printed = train(out, "--train.precision", resumed, "--resume")
        assert (f"tessel: the checkpoint was trained in {saved}; this run continues in {resumed} from its fp32 "
                "masters") in printed
        start, end = weights(runs[saved], 3), weights(out, 6)
        same, other = weights(runs[resumed], 6), weights(runs[saved], 6)
        for name, w in end.items():
            assert w.dtype == torch.float32, name
            assert not torch.equal(w, start[name]) or w.ndim == 1, name  # it trained from the saved weights
            bound = SLACK * (same[name] - other[name]).abs().max() + 1e-7
            assert (w - same[name]).abs().max() <= bound, name


def test_precision_accuracy_example_pairs_each_seed_in_both_precisions(tmp_path, monkeypatch, capsys, world1):
    """examples/precision_accuracy.py on a tiny run: one seed in each precision, the held-out losses it reports are
    the runs' own, and the relative difference is computed from them. Each run is `tessel train`'s own main, its
    worker the rank of a test world."""
    import json

    import trained

    protocol = trained.example("precision_accuracy", monkeypatch)
    trained.main_in([world1], tmp_path, monkeypatch, protocol)
    monkeypatch.chdir(tmp_path)
    tiny = ["--model.dim", "16", "--model.layers", "1", "--model.heads", "2", "--vocab", "64", "--seq-len", "8",
            "--batch", "8", "--steps", "3", "--nproc", "1"]
    trained.script_main(protocol, ["--seeds", "0", "--out", str(tmp_path), "--", *tiny], monkeypatch)
    got = json.loads((tmp_path / "results.json").read_text())
    (seed, fp32, bf16), = got["rows"]
    for prec, loss in (("fp32", fp32), ("bf16-mixed", bf16)):
        summary = json.loads((tmp_path / f"{prec}-s0" / "summary.json").read_text())
        assert summary["heldout"]["final"]["loss"] == loss and summary["steps_run"] == 3
    assert abs(got["mean_pct"] - 100 * (bf16 / fp32 - 1)) < 1e-12 and "seed 0:" in capsys.readouterr().out
    (tmp_path / "results.json").unlink()  # --report-only rebuilds it from the runs' summaries, training nothing
    made = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*-s0/summary.json")}
    trained.script_main(protocol, ["--seeds", "0", "--out", str(tmp_path), "--report-only"], monkeypatch)
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == got["rows"]
    assert len(made) == 2 and all(p.stat().st_mtime_ns == t for p, t in made.items())


def test_row_gradient_width_example_measures_each_way_of_summing(tmp_path, monkeypatch, capsys):
    """examples/row_gradient_width.py (docs/usage.md, the row gradients' width) on a tiny run: every way of summing
    the ranks' row gradients is measured against the exact sum, and rounding the contributions to bf16 moves the
    sum by something, and by less than bf16 compute's own error (over all the touched rows)."""
    import trained

    monkeypatch.chdir(tmp_path)  # in this process, as the script runs it
    argv = ["--model", "transformer_lm", "--warm", "2", "--batches", "1", "--global-batch", "8"]
    trained.script_main(trained.example("row_gradient_width", monkeypatch), argv, monkeypatch)
    printed = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [float(v) for v in line.split("|")[2:5]]
            for line in printed.splitlines() if line.startswith("| bf16")}
    assert len(rows) == 4 and all(0 < v < 1 for errs in rows.values() for v in errs), printed
    own = rows["bf16 push, each rank, against the fp32 push (the push's own rounding)"]
    assert own[0] < rows["bf16 compute, fp32 push"][0], printed


def test_attention_widens_to_fp32_under_cpu_autocast_and_recomputes_alike():
    """On CPU, bf16 autocast's attention computes in fp32 (tessel/models/attention.py, where torch's CPU kernel is the
    faster one): the output is fp32 attention of the same bf16 q, k, v, rounded once to bf16, not the bf16 kernel's.
    A recomputed layer (activation checkpointing restores autocast, nothing else) computes it the same way, so its
    output and gradients equal the kept forward's bit for bit. Without autocast it is torch's attention as is."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    from tessel.models.attention import causal_attention
    from tessel.models.transformer_lm import CausalSelfAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 32).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = causal_attention(q, k, v)
    wide = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).bfloat16()
    assert y.dtype == torch.bfloat16 and torch.equal(y, wide)
    assert not torch.equal(wide, F.scaled_dot_product_attention(q, k, v, is_causal=True))  # the test can fail
    x64 = torch.randn(2, 16, 32, dtype=torch.float64)
    assert torch.equal(causal_attention(x64[:, None], x64[:, None], x64[:, None]),
                       F.scaled_dot_product_attention(x64[:, None], x64[:, None], x64[:, None], is_causal=True))

    attn = CausalSelfAttention(32, 2, 0.0)
    outs, grads = [], []
    for recompute in (False, True):
        x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(attn, x, use_reentrant=False) if recompute else attn(x)
        out.float().square().sum().backward()
        outs.append(out.detach())
        grads.append([x.grad, *(p.grad.clone() for p in attn.parameters())])
        attn.zero_grad()
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def _classifier_loop(precision: str, plan=None):
    """The classifier (2 hidden layers, no attention: every product rounds in bf16 on both sides) for STEPS steps
    of SGD: a plain torch loop with CPU autocast in one process (``plan`` None), or tessel.prepare(..., plan,
    precision) through model.step on this world. (losses, this rank's weights, the pp bytes, the optimizer's
    parameters' dtypes)."""
    import tessel
    from tessel.models import DenseClassifier

    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(B, 8, generator=g), torch.randint(0, 4, (B,), generator=g)) for _ in range(STEPS)]
    torch.manual_seed(3)
    model = DenseClassifier(in_features=8, hidden=16, layers=2, classes=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    if plan is None:
        losses = []
        for x, y in batches:
            with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16-mixed"):
                loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, 0, set()
    model, opt, loader = tessel.prepare(model, opt, batches, plan=plan, precision=precision, verbose=False)
    comm.counter.end_step()
    losses = [float(model.step(x, y)) for x, y in loader]
    pp = comm.counter.end_step().get("pp", {"sent": 0})["sent"]
    held = {n.removeprefix("root."): p.detach() for n, p in model.module.named_parameters()}
    return losses, held, pp, {p.dtype for g in opt.optimizer.param_groups for p in g["params"]}  # the rank's own


def prepared_axes_bf16():
    """tessel.prepare under pp2 (1f1b, 2 micro-batches) and tp2 (1-D) in bf16-mixed and fp32."""
    from tessel import ParallelPlan

    plans = {"pp2": ParallelPlan(dp=1, pp=2, micro_batches=2), "tp2": ParallelPlan(dp=1, tp=2, tp_grid=(2,))}
    return {name: {p: _classifier_loop(p, plan) for p in ("bf16-mixed", "fp32")} for name, plan in plans.items()}


def test_prepare_under_pp_and_tp_takes_a_precision(world2):
    """A user's loop under a pipeline and under tensor parallelism in bf16-mixed: its losses and fp32 masters within
    the module's 3x bound of one process in bf16-mixed (a plain autocast loop), its optimizer stepping fp32 weights,
    and the activations crossing the stage cut at half width."""
    bf16, fp32 = _classifier_loop("bf16-mixed"), _classifier_loop("fp32")
    loss_gap = max(abs(a - b) for a, b in zip(bf16[0], fp32[0]))
    weight_gap = {n: float((bf16[1][n] - fp32[1][n]).abs().max()) for n in bf16[1]}
    assert loss_gap > 0  # bf16 rounded something: the yardstick is not zero
    got = world2.run(prepared_axes_bf16)
    for rank, cases in enumerate(got):
        for name, runs in cases.items():
            losses, held, pp, dtypes = runs["bf16-mixed"]
            assert dtypes == {torch.float32}, (name, dtypes)  # the masters the optimizer steps
            assert losses != runs["fp32"][0], name  # it computed in bf16 (fp32's run would be the same run)
            assert max(abs(a - b) for a, b in zip(losses, bf16[0])) <= SLACK * loss_gap + 1e-7, (name, losses)
            for n, w in held.items():
                assert w.dtype == torch.float32, n
                if name == "pp2":  # a stage holds its layers whole (tp2's blocks are cut: their losses judge them)
                    assert (w - bf16[1][n]).abs().max() <= SLACK * weight_gap[n] + 1e-7, (name, n)
            if name == "pp2" and rank == 0:
                # the first stage sends each micro-batch's (B/2, 16) activation: 2 bytes an element, not fp32's 4
                assert pp == STEPS * 2 * (B // 2) * 16 * 2 and runs["fp32"][2] == 2 * pp, (pp, runs["fp32"][2])


def test_the_issues_two_commands_run_as_written_and_print_their_bytes(world8, world4, tmp_path):
    """``tessel train --train.precision bf16-mixed --dp 2 --pp 2 --tp 2`` and the same with ``--model lstm_lm
    --model.softmax sampled --sparse ps --pp 2 --dp 2``, on tiny shapes: each runs, its summary says bf16-mixed
    and prints its bytes per channel, and the stage cut's activations cross at 2 bytes an element."""
    from tessel.train.metrics import format_summary
    from trained import train as trained

    steps = ["--steps", "2", "--metrics.progress", "log"]
    tf = ["--model.dim", "16", "--model.layers", "2", "--model.heads", "2", "--vocab", "64", "--seq-len", "8",
          "--batch", "8", *steps]
    summary, _ = trained(world8, tmp_path, "--train.precision", "bf16-mixed", "--dp", "2", "--pp", "2", "--tp", "2",
                         *tf, "--out", str(tmp_path / "tf"))
    printed = format_summary(summary)  # what the rank logging the loss prints at the end
    assert "dp=2 pp=2 tp=2 (world 8), bf16-mixed, 2 steps" in printed and "bytes per channel" in printed
    # one micro-batch of (8/2 sequences x 8 tokens, 16 wide) a step, the 1-D residual whole on each tp rank: the
    # first stage's ranks send it forward and the last's its gradient back, 2 bytes an element (fp32: 4)
    assert summary["bytes"]["pp"]["sent_per_step_per_rank"] == (8 // 2) * 8 * 16 * 2, summary["bytes"]
    lstm = ["--model", "lstm_lm", "--model.softmax", "sampled", "--model.num_sampled", "16", "--model.dim", "8",
            "--model.hidden", "16", "--vocab", "200", "--seq-len", "4", "--batch", "8", *steps]
    summary, _ = trained(world4, tmp_path, "--train.precision", "bf16-mixed", *lstm, "--sparse", "ps", "--pp", "2",
                         "--dp", "2", "--out", str(tmp_path / "lstm"))
    printed = format_summary(summary)
    assert "dp=2 pp=2 tp=1 (world 4), bf16-mixed, 2 steps" in printed and "ps.pull" in printed
    assert summary["precision"] == "bf16-mixed" and summary["bytes"]["ps.pull"]["sent_per_step_per_rank"] > 0
