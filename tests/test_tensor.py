"""Tensor parallelism: every layer and the whole Transformer LM equal single-process training, bytes exact.

One 8-rank gloo world runs every grid: 1-D at 2 and 4 ranks, 2-D 2x2, 3-D 2x2x1 (each beside data
parallelism filling the rest of the world), 3-D 2x2x2 and 2-D 2x4 on all 8. fp64 throughout, to 1e-10.
"""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from composed import check_before_workers
from steps import TorchReference, tessel_engine
from tessel import comm
from tessel.chain import chain_of
from tessel.config import load_config
from tessel.errors import PlanError
from tessel.mesh import ParallelDims, build_mesh
from tessel.models.transformer_lm import MLP, CausalSelfAttention, TransformerLM
from tessel.parallelize import apply_ddp
from tessel.settings import Settings
from tessel.tensor import GridSpec, TensorParallel, apply_whole, check_shapes
from tessel.tensor.cost import block_bytes, linear_traffic
from tessel.tensor.grid import Grid
from tessel.tensor.layers import TPEmbedding, TPLayerNorm, TPLinear, rows_of, vocab_cross_entropy
from tessel.tensor.layout import Layout, check_chain, plan_for
from tessel.tensor.model import TPMLP, TPAttention
from tessel.train.checkpoint import load_weights, save
from tessel.train.memory import SavedBytes
from tessel.train.optim import build_optimizer

ATOL = 1e-10
B, T, H, HEADS, V = 8, 4, 16, 4, 64  # sequences per dp rank, length, width, heads, vocab


def _grid(mode, tp, shape=""):
    dims = ParallelDims.resolve(dist.get_world_size(), tp=tp)
    spec = GridSpec.parse(mode, tp, shape)
    mesh = build_mesh(dims, 20, spec.axes if mode in ("2d", "3d") else ())
    return dims, spec, mesh, Grid(spec, mesh) if mode != "torch-1d" else None


def _block(grid, full, layout):
    """This rank's block of a full (B, T, F) activation in ``layout``."""
    x = rows_of(grid, full, layout.rows, "activation")
    if layout.cols:
        i, n = grid.block((layout.cols,))
        x = x.chunk(n, -1)[i]
    return x


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _compare(name, got, want):
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=name)


def linear_bytes(mode, grid, spec, m, h, h2, regather=False):
    """The formula of tessel.tensor.layout: bytes one rank sends for one linear, forward + backward, fp64."""
    P = grid.spec.size
    if mode == "1d":
        n = m * (h if spec.copy else h2)
        return 2 * (P - 1) * n * 8 // P
    s, z, r = grid.size(spec.x_gather), grid.size(spec.w_gather), grid.size(spec.reduce_scatter)
    gathers = (s - 1) * m * h + (z - 1) * h * h2
    return (2 * gathers + 2 * (r - 1) * m * h2 + (gathers if regather else 0)) * 8 // P


def check_layers(mode, tp, shape, regather):
    dims, gspec, mesh, grid = _grid(mode, tp, shape)
    plan = plan_for(mode)
    R = plan.residual
    m = B * T
    out = {}

    def run(name, layer, x_full, inp, outl, ref_fn, params, fwd_args=()):
        x_ref = x_full.clone().requires_grad_(inp is not None)
        y_ref = ref_fn(x_ref)
        dy = _rand(*y_ref.shape, seed=7)
        y_ref.backward(dy)
        x = _block(grid, x_full, inp).clone().requires_grad_(True) if inp is not None else x_full
        comm.counter.reset()
        y = layer(x, *fwd_args)
        y.backward(_block(grid, dy, outl))
        out[name] = sum(v["sent"] for c, v in comm.counter.total().items() if c.startswith("tp"))
        TensorParallel(layer, grid).reduce_grads()  # biases' partial sums: not part of the layer's formula
        _compare(f"{name} output", y, _block(grid, y_ref.detach(), outl))
        if inp is not None:
            _compare(f"{name} input grad", x.grad, _block(grid, x_ref.grad, inp))
        for pname, (mine, ref) in params.items():
            _compare(f"{name} {pname} grad", mine.grad, grid.local(ref.grad, mine.tp_split))

    torch.manual_seed(3)
    up_full, down_full = torch.nn.Linear(H, 2 * H).double(), torch.nn.Linear(2 * H, H).double()
    up = TPLinear(up_full, plan.up, grid, regather, "up")
    down = TPLinear(down_full, plan.down, grid, regather, "down")
    run("up", up, _rand(B, T, H, seed=1), plan.up.inp, plan.up.out, up_full,
        {"weight": (up.weight, up_full.weight), "bias": (up.bias, up_full.bias)})
    assert out["up"] == linear_bytes(mode, grid, plan.up, m, H, 2 * H, regather), out
    run("down", down, _rand(B, T, 2 * H, seed=2), plan.down.inp, plan.down.out, down_full,
        {"weight": (down.weight, down_full.weight), "bias": (down.bias, down_full.bias)})
    assert out["down"] == linear_bytes(mode, grid, plan.down, m, 2 * H, H, regather), out

    ln_full = torch.nn.LayerNorm(H).double()
    with torch.no_grad():
        ln_full.weight.copy_(_rand(H, seed=4))
        ln_full.bias.copy_(_rand(H, seed=5))
    ln = TPLayerNorm(ln_full, R, grid, "ln")
    run("ln", ln, _rand(B, T, H, seed=3) * 3 + 1, R, R, ln_full,
        {"weight": (ln.weight, ln_full.weight), "bias": (ln.bias, ln_full.bias)})

    # LayerNorm: one all-reduce of (sum, sum of squares) per row forward, one of two sums backward
    c, rows_here = grid.size(R.cols), m // grid.block(R.rows)[1]
    assert out["ln"] == (2 * (2 * (c - 1) * 2 * rows_here * 8 // c) if c > 1 else 0), out

    emb_full = torch.nn.Embedding(V, H).double()
    emb = TPEmbedding(emb_full, plan.embedding, grid)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(6))
    run("embedding", emb, ids, None, R, lambda i: emb_full(i), {"weight": (emb.weight, emb_full.weight)})
    # gather the table, reduce-scatter the rows (and their adjoints); 1-D: Megatron's all-reduce of the output
    e, p = plan.embedding, gspec.size
    want = 2 * ((grid.size(e.w_gather) - 1) * V * H // p + (grid.size(e.reduce_scatter) - 1) * m * H // p) * 8
    assert out["embedding"] == want + (2 * (p - 1) * m * H * 8 // p if e.all_reduce else 0), out

    attn_full = CausalSelfAttention(H, HEADS, 0.0).double()
    attn = TPAttention(attn_full, plan, grid, regather, "attn")
    run("attention", attn, _rand(B, T, H, seed=8), R, R, attn_full,
        {f"{p}.weight": (getattr(attn, p).weight, getattr(attn_full, p).weight)
         for p in ("q_proj", "k_proj", "v_proj", "out_proj")})
    mlp_full = MLP(H, 4 * H, 0.0).double()
    mlp = TPMLP(mlp_full, plan, grid, regather, "mlp")
    run("mlp", mlp, _rand(B, T, H, seed=9), R, R, mlp_full,
        {"fc_in.weight": (mlp.fc_in.weight, mlp_full.fc_in.weight),
         "fc_out.bias": (mlp.fc_out.bias, mlp_full.fc_out.bias)})

    head_full = torch.nn.Linear(H, V, bias=False).double()
    head = TPLinear(head_full, plan.up, grid, regather, "head")
    targets = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(10))
    x_full = _rand(B, T, H, seed=11)
    x_ref = x_full.clone().requires_grad_(True)
    loss_ref = F.cross_entropy(head_full(x_ref).reshape(-1, V), targets.reshape(-1))
    loss_ref.backward()
    x = _block(grid, x_full, R).clone().requires_grad_(True)
    loss = vocab_cross_entropy(head(x), rows_of(grid, targets, plan.up.out.rows, "t"), plan.up.out, grid, B * T)
    loss.backward()
    TensorParallel(head, grid).reduce_grads()
    _compare("loss", loss, loss_ref.detach())
    _compare("head input grad", x.grad, _block(grid, x_ref.grad, R))
    _compare("head weight grad", head.weight.grad, grid.local(head_full.weight.grad, head.weight.tp_split))
    return out


GRIDS = [("1d", 2, ""), ("1d", 4, ""), ("2d", 4, ""), ("3d", 4, "2x2x1"), ("3d", 8, ""), ("2d", 8, "2x4")]


@pytest.mark.parametrize("mode,tp,shape", GRIDS)
def test_layers_match_single_process_with_exact_bytes(world8, mode, tp, shape):
    got = world8.run(check_layers, mode, tp, shape, False)
    assert got[0]["up"] > 0 and got[0]["down"] > 0


def test_layers_regather_3d(world8):
    got = world8.run(check_layers, "3d", 8, "", True)
    q = 2
    # the 2x2x2 cube formula, 2(q-1)(M h + M h' + h h')/q^3 elements of 8 bytes, plus the re-gathers
    m, h, h2 = B * T, H, 2 * H
    assert got[0]["up"] == (2 * (q - 1) * (m * h + m * h2 + h * h2) + (q - 1) * (m * h + h * h2)) * 8 // q**3


def check_live_linear():
    """A 3-D up-projection whose backward must read its weight as it is then (async, async-predict v1): the
    weight shard is changed between forward and backward; returns (bytes sent, input-gradient error)."""
    dims, gspec, mesh, grid = _grid("3d", 8, "")
    grid.live_weights = True
    torch.manual_seed(3)
    full = torch.nn.Linear(H, 2 * H).double()
    up = TPLinear(full, plan_for("3d").up, grid, False, "up")
    x_full, dy_full = _rand(B, T, H, seed=1), _rand(B, T, 2 * H, seed=7)
    x = _block(grid, x_full, plan_for("3d").up.inp).clone().requires_grad_(True)
    comm.counter.reset()
    # as the asynchronous runtime does: the forward runs on aliases of the parameters (their own version
    # counters), so an in-place update before the backward reaches what the backward reads
    aliases = {n: p.data.requires_grad_(True) for n, p in up.named_parameters()}
    y = torch.func.functional_call(up, aliases, (x,))
    with torch.no_grad():  # an update lands between forward and backward, on every shard
        up.weight.mul_(2.0)
        full.weight.mul_(2.0)
    y.backward(_block(grid, dy_full, plan_for("3d").up.out))
    sent = sum(v["sent"] for c, v in comm.counter.total().items() if c.startswith("tp"))
    want = dy_full.reshape(-1, 2 * H) @ full.weight.detach()  # the backward at the new weights
    got_full = want.reshape(B, T, H)
    err = float((x.grad - _block(grid, got_full, plan_for("3d").up.inp)).abs().max())
    return sent, err


def test_live_weights_gathered_again_in_backward(world8):
    got = world8.run(check_live_linear)
    q, m, h, h2 = 2, B * T, H, 2 * H
    # the cube formula 2(q-1)(M h + M h' + h h')/q^3, plus the weight gathered once more in backward
    want = (2 * (q - 1) * (m * h + m * h2 + h * h2) + (q - 1) * h * h2) * 8 // q**3
    assert got[0][0] == want
    assert all(err < ATOL for _, err in got)
    # the planner prices it the same way
    assert sum(e for _, e, _, _ in linear_traffic("3d", (2, 2, 2), m, h, h2, True, live=True)) * 8 == want


def check_lm(mode, tp, shape, optimizer, steps=3, regather=False, sequence_parallel=False):
    dims, gspec, mesh, grid = _grid(mode, tp, shape)
    cfg = load_config(None, [f"train.optimizer={optimizer}", "train.lr=0.05", "train.warmup=1", "train.clip=0.5",
                             "train.dtype=float64"]).train
    torch.manual_seed(1)
    ref = TransformerLM(V, T, dim=H, layers=2, heads=HEADS).double()
    model, tp_handle = apply_whole(copy.deepcopy(ref), gspec, mesh, regather, sequence_parallel)
    if dims.dp > 1:
        model = apply_ddp(model, mesh.get_group("dp"))
    engine = tessel_engine(model, cfg, tp=tp_handle)
    ref_engine = TorchReference(ref, cfg)
    dp_rank = mesh.get_local_rank("dp")
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        x, y = torch.randint(0, V, (B * dims.dp, T), generator=g), torch.randint(0, V, (B * dims.dp, T), generator=g)
        res = engine.step(x.chunk(dims.dp)[dp_rank], y.chunk(dims.dp)[dp_rank], step)
        ref_res = ref_engine.step(x, y, step)
        mean = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(mean, "meta", group=mesh.get_group("dp"))
        assert abs(float(mean) / dims.dp - ref_res.loss) < ATOL
        assert abs(res.grad_norm - ref_res.grad_norm) < ATOL, (res.grad_norm, ref_res.grad_norm)
    if mode != "torch-1d":  # torch's collectives do not go through tessel.comm
        sent = comm.counter.total()["tp"]["sent"]
        assert sent == steps * 2 * block_bytes(mode, gspec.shape, B * T, H, 4 * H, 8, regather), sent
    refp = dict(ref.named_parameters())
    names = []
    for n, p in getattr(model, "module", model).named_parameters():
        n = n.removeprefix("root.")  # tessel's modes run the model under a Runner; torch-1d runs it as it is
        if mode == "torch-1d":
            _compare(n, p.full_tensor() if hasattr(p, "full_tensor") else p, refp[n])
        else:
            _compare(n, p, grid.local(refp[n], p.tp_split))
        names.append(n)
    assert sorted(names) == sorted(refp)  # same names as the plain model: checkpoints move between modes
    return engine.activation_bytes, ref_engine.activation_bytes


@pytest.mark.parametrize("mode,tp,shape,optimizer", [(*g, o) for g, o in zip(GRIDS, ["adamw", "sgd"] * 3)])
def test_lm_training_matches_single_process(world8, mode, tp, shape, optimizer):
    world8.run(check_lm, mode, tp, shape, optimizer)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_torch_native_1d_matches_single_process(world4, sequence_parallel):
    # loss_parallel always (the logits stay sharded by vocabulary); torch's sequence parallelism on request
    world4.run(check_lm, "torch-1d", 4, "", "adamw", sequence_parallel=sequence_parallel)


def test_regather_keeps_shards_only(world8):
    kept = world8.run(check_lm, "3d", 8, "", "sgd", 1, False)[0][0]
    regathered, single = world8.run(check_lm, "3d", 8, "", "sgd", 1, True)[0]
    assert regathered < kept
    assert regathered * 6 < single  # ~1/8 of one process's activations (norm statistics differ slightly)


def check_checkpoint(tmp, phase):
    torch.manual_seed(1)
    ref = TransformerLM(V, T, dim=H, layers=2, heads=HEADS).double()
    if phase == "save":
        dims, gspec, mesh, grid = _grid("3d", 8, "")
        model, tp = apply_whole(copy.deepcopy(ref), gspec, mesh)
        opt = build_optimizer(model.parameters(), Settings(optimizer="adamw", dtype="float64"))
        model(torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))).backward()
        tp.reduce_grads()
        opt.step()
        save(tmp, 1, model.root, opt, {"position": 0, "dp_size": 1, "global_batch": B}, {"model": {}}, tables=None,
             tp=tp)
        return {n: p.detach().clone() for n, p in model.root.named_parameters()}
    mode, tp_size, shape = phase
    dims, gspec, mesh, grid = _grid(mode, tp_size, shape)
    model, tp = apply_whole(copy.deepcopy(ref), gspec, mesh)
    load_weights(f"{tmp}/step-00000001", model.root, {"model": {}}, tp)
    return {n: (p.detach().clone(), p.tp_split) for n, p in model.root.named_parameters()}, grid.coords


def test_checkpoint_moves_between_modes(world8, tmp_path):
    saved = world8.run(check_checkpoint, str(tmp_path), "save")
    # single process: the full tensors, assembled by DCP from the 3-D shards
    torch.manual_seed(1)
    plain = TransformerLM(V, T, dim=H, layers=2, heads=HEADS).double()
    load_weights(tmp_path / "step-00000001", plain, {"model": {}})
    for phase in [("1d", 4, ""), ("2d", 8, "2x4")]:
        for params, coords in world8.run(check_checkpoint, str(tmp_path), phase):
            grid = Grid(GridSpec.parse(phase[0], phase[1], phase[2]))
            grid.coords = coords
            for n, (p, split) in params.items():
                _compare(f"{phase} {n}", p, grid.local(dict(plain.named_parameters())[n].detach(), split))
    # and the plain model holds exactly what the 3-D ranks held
    grid = Grid(GridSpec.parse("3d", 8, ""))
    full = dict(plain.named_parameters())
    moved = max(float((p - grid.local(full[n].detach(), split)).abs().max())
                for n, (p, split) in world8.run(check_checkpoint, str(tmp_path), ("3d", 8, ""))[0][0].items())
    assert moved == 0.0
    torch.manual_seed(1)
    init = TransformerLM(V, T, dim=H, layers=2, heads=HEADS).double()
    assert float((init.tok_emb.weight - plain.tok_emb.weight).detach().abs().max()) > 0  # the update is in it
    assert saved[0]["tok_emb.weight"].shape == (V // 4, H // 2)


def test_layout_mismatch_is_refused():
    a, b = Layout(rows=("tp_z", "tp_x"), cols="tp_y"), Layout(rows=("tp_z", "tp_y"), cols="tp_x")
    with pytest.raises(PlanError, match="layer 'b' expects input layout rows/tp_z.tp_x cols/tp_y but 'a' gives"):
        check_chain([("a", a, b), ("b", a, a)])
    for mode in ("1d", "2d", "3d"):
        plan_for(mode).check()


def _cfg(*extra):
    return load_config(None, ["model.name=transformer_lm", "model.dim=16", "model.heads=4", "data.vocab_size=64",
                              "data.seq_len=8", *extra])


@pytest.mark.parametrize("extra,tp,message", [
    (["tensor.mode=3d", "tensor.grid=2x2"], 8, "tensor.grid '2x2' is invalid for mode 3d"),
    (["tensor.mode=2d", "tensor.grid=2x3"], 8, "has 6 ranks but tp=8"),
    (["model.name=lstm_lm"], 2, "applies to models transformer_lm and classifier, not lstm_lm"),
    (["tensor.mode=torch-1d", "parallel.dp=2"], 4, "runs alone"),
    (["tensor.sequence_parallel=true"], 2, "only the torch-1d peer runs"),
    (["parallel.pp=2", "sparse.strategy=torch-sparse", "train.optimizer=sgd"], 4, "torch-sparse under pp and tp"),
    (["tensor.mode=2d", "sparse.strategy=ps"], 4, "only the 1-D vocabulary shard"),
])
def test_config_errors(extra, tp, message):
    cfg = _cfg(f"parallel.tp={tp}", *extra)
    with pytest.raises(PlanError, match=message):
        check_before_workers(cfg)


@pytest.mark.parametrize("mode,tp,batch,message", [
    ("1d", 8, 8, "4 attention heads do not split over 8 ranks"),
    ("3d", 8, 2, "micro-batch of 2 sequences per data-parallel rank does not split into 4 blocks"),
    ("2d", 4, 8, None),
])
def test_shape_errors(mode, tp, batch, message):
    with torch.device("meta"):
        model = TransformerLM(64, 8, dim=16, layers=1, heads=4)
    spec = GridSpec.parse(mode, tp)
    if message is None:
        check_shapes(model, chain_of(model), spec, batch)
    else:
        with pytest.raises(PlanError, match=message):
            check_shapes(model, chain_of(model), spec, batch)


def test_saved_bytes_counts_activations_not_weights():
    lin = torch.nn.Linear(8, 8).double()
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with SavedBytes(lin.parameters()) as saved:
        lin(x).sum()
    assert saved.bytes == 4 * 8 * 8  # the input only, the weight is a parameter


def test_workers_and_degrees_follow_tp():
    assert _cfg("parallel.tp=8").nproc == 8 and _cfg().nproc == 2 and _cfg("parallel.nproc=3").nproc == 3
    dims = ParallelDims.resolve(8, tp=0)
    assert (dims.dp, dims.tp) == (1, 8)
    assert ParallelDims.resolve(8, dp=2, tp=0).tp == 4
    assert GridSpec.parse("3d", 4).shape == (2, 2, 1) and GridSpec.parse("2d", 8).shape == (4, 2)
