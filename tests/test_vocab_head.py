"""The fused head and loss (tessel.models.vocab_head) against F.cross_entropy over whole logits, written here.

Every composition's parity test also runs it (the reference side in tests/steps.py takes the plain loss over the
model's whole logits while tessel's side runs the fused one); these check its edges directly."""

import pytest
import torch
import torch.nn.functional as F

from tessel.models import LSTMLM, TransformerLM, vocab_head
from tessel.models.vocab_head import VocabHead
from tessel.train.memory import PeakTensors

N, D, V = 64, 16, 96


@pytest.fixture
def blocks_of_7_rows(monkeypatch):
    # several blocks and a ragged last one (64 rows = 9 blocks of 7 + 1)
    monkeypatch.setitem(vocab_head._BLOCK, "cpu", 7 * V)


def _grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("bias", [False, True])
def test_fp64_loss_and_gradients_equal_cross_entropy(blocks_of_7_rows, bias):
    torch.manual_seed(0)
    head = VocabHead(D, V, bias=bias).double()
    h = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, V, (N,))
    t[[3, 20, 63]] = -100  # ignored rows: no loss, no gradient, not counted in the mean
    params = [h, *head.parameters()]
    fused = head(h, t)
    plain = F.cross_entropy(F.linear(h, head.weight, head.bias), t)
    assert abs(float(fused - plain)) < 1e-13
    for a, b in zip(_grads(0.7 * fused, *params), _grads(0.7 * plain, *params)):
        assert float((a - b).abs().max()) < 1e-13
    with torch.no_grad():  # evaluation: the loss alone, no gradient made
        assert abs(float(head(h, t) - plain)) < 1e-13
    assert head(h[:4]).shape == (4, V)  # without targets: the logits, as nn.Linear gives them


def test_bf16_matches_autocast_cross_entropy_within_one_rounding(blocks_of_7_rows):
    """Under autocast both paths round h and the weight to bf16 and the products' outputs to bf16 alike, and
    take the softmax in fp32: the loss differs only by fp32 sums in another order (1e-6 relative is 60 fp32
    ulps), the hidden states' gradient not at all beyond that (the same rows times the same weight). The
    weight's gradient is summed over blocks of rows, each block's product rounded to bf16 once before an fp32
    sum, where autocast rounds the whole sum once: at most one bf16 rounding (2^-8 relative) of a block's part
    apart, so within 2^-8 of the largest entry."""
    torch.manual_seed(0)
    head = VocabHead(D, V, bias=False)
    h = torch.randn(N, D, requires_grad=True)
    t = torch.randint(0, V, (N,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = head(h, t)
        plain = F.cross_entropy(head(h), t)
    assert fused.dtype == plain.dtype == torch.float32
    assert abs(float(fused - plain)) <= 1e-6 * float(plain)
    (gh, gw), (ph, pw) = _grads(fused, h, head.weight), _grads(plain, h, head.weight)
    assert gw.dtype == torch.float32 and gh.dtype == torch.float32
    assert float((gh - ph).abs().max()) <= 1e-6 * float(ph.abs().max())
    assert float((gw - pw).abs().max()) <= 2 ** -8 * float(pw.abs().max())


def test_the_logits_are_never_whole():
    """At the default block size (2M elements, 8 MiB in fp32, on CPU), a step of the fused loss over 8M logits adds
    less than half of their 32 MiB at its peak; the plain one adds them whole and more (the log-softmax and its
    gradient)."""
    torch.manual_seed(0)
    rows, vocab = 8192, 1024
    head = VocabHead(D, vocab, bias=False)
    h = torch.randn(rows, D, requires_grad=True)
    t = torch.randint(0, vocab, (rows,))
    logits = rows * vocab * 4
    for fused, bound in ((True, logits / 2), (False, logits)):
        with PeakTensors([h, t, head.weight]) as peak:
            loss = head(h, t) if fused else F.cross_entropy(head(h), t)
            loss.backward()
        added = peak.bytes - peak.entry
        assert (added < bound) if fused else (added > bound), (fused, added, bound)
        h.grad = head.weight.grad = None


@pytest.mark.parametrize("make", [
    lambda: TransformerLM(V, 8, dim=D, layers=1, heads=2, tie_embeddings=True, softmax="full"),
    lambda: LSTMLM(V, dim=D, hidden=2 * D, softmax="full")], ids=["transformer-tied", "lstm"])
def test_models_loss_is_the_cross_entropy_of_their_logits(make):
    torch.manual_seed(0)
    model = make().double()
    x, y = torch.randint(0, V, (4, 8)), torch.randint(0, V, (4, 8))
    params = list(model.parameters())
    fused = model(x, y)
    plain = F.cross_entropy(model.logits(x).reshape(-1, V), y.reshape(-1))
    assert abs(float(fused - plain)) < 1e-13
    for a, b in zip(_grads(fused, *params), _grads(plain, *params)):
        assert float((a - b).abs().max()) < 1e-13
