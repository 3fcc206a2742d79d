"""Data parallelism (DDP on the mesh's dp group) equals single-process training on the same global batch.

fp64, several optimizer steps, gradient clipping on: outputs (the global loss), gradients and
parameters must agree to 1e-10 at 2 and 4 ranks, for each reference model.
"""

import pytest
import torch
import torch.distributed as dist

from steps import TorchReference, step_side_by_side, tessel_engine
from tessel import comm
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import ParallelDims, build_mesh
from tessel.parallelize import apply_ddp
from tessel.train.build import build, build_data

SMALL = {
    "transformer_lm": ["model.dim=16", "model.layers=2", "model.heads=2", "data.vocab_size=64", "data.seq_len=8"],
    "lstm_lm": ["model.dim=12", "model.hidden=16", "model.softmax=sampled", "model.num_sampled=16",
                "data.vocab_size=80", "data.seq_len=6"],
    "classifier": ["model.in_features=24", "model.hidden=32", "model.layers=2", "model.classes=5"],
}
ATOL = 1e-10


def check_parity(name: str, optimizer: str, micro: int, steps: int = 4):
    p, r = dist.get_world_size(), dist.get_rank()
    cfg = load_config(None, [f"model.name={name}", *SMALL[name], "train.dtype=float64", "train.global_batch=8",
                             f"train.micro_batches={micro}", f"train.optimizer={optimizer}", "train.lr=0.05",
                             "train.warmup=2", "train.clip=0.5", f"train.steps={steps}"])
    dims = ParallelDims.resolve(p)
    mesh = build_mesh(dims, timeout=20)
    data = build_data(cfg)
    vocab = getattr(data, "vocab_size", 0)
    torch.manual_seed(1)
    ref = build(cfg, vocab).double()
    torch.manual_seed(1)
    model = apply_ddp(build(cfg, vocab).double(), mesh.get_group("dp"))
    loader = ShardedLoader(data, 8, r, p)
    ref_loader = ShardedLoader(data, 8, 0, 1)

    # one forward/backward: global loss and averaged gradients equal the single-process ones
    x, y = loader.next_batch()
    rx, ry = ref_loader.next_batch()
    x, rx = (t.double() if t.is_floating_point() else t for t in (x, rx))
    rng = torch.get_rng_state()
    loss = model(x, y)
    loss.backward()
    torch.set_rng_state(rng)  # the sampled softmax draws the same candidates in the reference
    ref_loss = ref(rx, ry)
    ref_loss.backward()
    total = loss.detach().clone()
    comm.all_reduce(total, "meta")
    torch.testing.assert_close(total / p, ref_loss.detach(), rtol=0, atol=ATOL)
    for (n, a), b in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=ATOL, msg=n)
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)

    engine = tessel_engine(model, cfg.train)
    ref_engine = TorchReference(ref, cfg.train)
    ref_res = step_side_by_side(engine, ref_engine, loader, ref_loader, steps, p, ATOL)
    moved = 0.0
    for (n, a), b in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=n)
        moved += float((a - b).abs().max())
    # the parameters really changed (a test that cannot fail proves nothing)
    torch.manual_seed(1)
    init = build(cfg, vocab).double()
    assert max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), init.parameters())) > 1e-3
    return float(ref_res.loss)


CASES = [("transformer_lm", "adamw", 2), ("lstm_lm", "sgd", 1), ("classifier", "adagrad", 2)]


@pytest.mark.parametrize("name,optimizer,micro", [*CASES, ("classifier", "nadamw", 2)])
def test_ddp_parity_2_ranks(world2, name, optimizer, micro):
    losses = world2.run(check_parity, name, optimizer, micro)
    assert len(set(losses)) == 1


@pytest.mark.parametrize("name,optimizer,micro", CASES)
def test_ddp_parity_4_ranks(world4, name, optimizer, micro):
    losses = world4.run(check_parity, name, optimizer, 1 if name == "lstm_lm" else micro)
    assert len(set(losses)) == 1


def test_gradient_squares_are_the_fp64_sum_in_every_width():
    """The step tail's squared norm: exact in fp64; in fp32 and bf16 within the width's rounding of the fp64
    sum (each tensor's norm in its own width, as torch's clip_grad_norm_ takes it), and a scalar in fp64."""
    from tessel.train.tail import local_sq, squares

    g = torch.randn(1000, 37, dtype=torch.float64)
    exact = float((g * g).sum())
    assert float(squares(g)) == pytest.approx(exact, rel=1e-14)
    assert float(squares(g.float())) == pytest.approx(exact, rel=1e-5)
    assert float(squares(g.bfloat16())) == pytest.approx(exact, rel=2e-2)
    assert squares(g.bfloat16()).dtype == torch.float64 and squares(g.bfloat16()).dim() == 0
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 1)]
    params[0].grad, params[1].grad = torch.tensor([1.0, 2.0, 2.0]), torch.tensor([4.0, 0.0]).to_sparse()
    assert local_sq(params).tolist() == [25.0]  # 1 + 4 + 4 + 16; a parameter without a gradient adds nothing


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fused_step_takes_gradients_laid_out_unlike_their_weights(optimizer):
    """On the CPU the dense optimizer is torch's fused kernel, which steps a gradient whose strides differ from its
    weight's wrong (2-D tensor parallelism under torch-zbv hands such over); the step tail lays each out as its
    weight first. One step from zero state, against the rule written here: SGD w - lr g; AdamW's first step
    w (1 - lr wd) - lr g / (|g| + eps) (bias-corrected moments m = g, v = g^2)."""
    from tessel.settings import Settings
    from tessel.train.optim import build_optimizer
    from tessel.train.tail import StepTail

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))
    start, lr = w.detach().clone(), 0.1
    settings = Settings(optimizer=optimizer, dtype="float64", lr=lr, weight_decay=0.01)
    optimizer_ = build_optimizer([w], settings)
    assert optimizer_.defaults.get("fused") is True
    big = torch.randn(24, 8, dtype=torch.float64)
    w.grad = big[8:16].t()  # a transposed view of a larger buffer: strides (1, 8), the weight's (8, 1)
    g = w.grad.clone()
    StepTail([w], optimizer_)(lr)
    if optimizer == "sgd":
        want = start - lr * (g + 0.01 * start)  # torch's SGD adds weight decay to the gradient
    else:
        want = start * (1 - lr * 0.01) - lr * g / (g.abs() + 1e-8)
    assert torch.allclose(w.detach(), want, rtol=0, atol=1e-12)
