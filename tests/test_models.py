"""Models: the uniform loss interface, float64 parity, sampled-softmax sparsity and exactness, errors."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from tessel.errors import ConfigError
from tessel.models import (
    LSTMLM,
    MODELS,
    DenseClassifier,
    SampledSoftmax,
    TransformerLM,
    build_model,
    count_parameters,
    log_uniform_sample,
)
from tessel.models.sampled_softmax import log_uniform_log_prob

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections")

V, T, B = 300, 12, 3

BASE = dict(vocab_size=V, seq_len=T, dim=16, hidden=0, layers=2, heads=4, dropout=0.0,
            tie_embeddings=False, softmax="full", num_sampled=40, in_features=20, classes=7)


def make(name, **over):
    torch.manual_seed(0)
    return build_model(name, **{**BASE, **over})


def batch(name, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    if name == "classifier":
        features = torch.randn(B, BASE["in_features"], generator=g, dtype=dtype)
        return features, torch.randint(0, 7, (B,), generator=g)
    x = torch.randint(0, V, (B, T + 1), generator=g)
    return x[:, :-1], x[:, 1:]


VARIANTS = [("transformer_lm", {}), ("transformer_lm", {"softmax": "sampled"}),
            ("transformer_lm", {"tie_embeddings": True}), ("lstm_lm", {}),
            ("lstm_lm", {"softmax": "sampled"}), ("classifier", {"hidden": 64})]
IDS = ["tfm-full", "tfm-sampled", "tfm-tied", "lstm-full", "lstm-sampled", "classifier"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,over", VARIANTS, ids=IDS)
def test_forward_backward_reaches_every_parameter(name, over, dtype):
    model = make(name, **over).to(dtype)
    inputs, targets = batch(name, dtype)
    torch.manual_seed(2)
    loss = model(inputs, targets)
    assert loss.dim() == 0 and loss.dtype == dtype and torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.dtype == dtype
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"no gradient reaches {pname}"
    out_shape = (B, 7) if name == "classifier" else (B, T, V)
    assert model.logits(inputs).shape == out_shape


@pytest.mark.parametrize("name,over", VARIANTS, ids=IDS)
def test_float64_matches_float32(name, over):
    model = make(name, **over)
    inputs, targets = batch(name)
    torch.manual_seed(3)
    loss32 = model(inputs, targets)
    torch.manual_seed(3)
    loss64 = copy.deepcopy(model).double()(inputs.double() if name == "classifier" else inputs, targets)
    assert loss64.dtype == torch.float64
    assert loss64.item() == pytest.approx(loss32.item(), rel=1e-5)


@pytest.mark.parametrize("name", ["transformer_lm", "lstm_lm"])
def test_lm_full_softmax_starts_near_uniform(name):
    model = make(name)
    loss = model(*batch(name))
    assert abs(loss.item() - math.log(V)) < 0.05


def test_log_uniform_sampler_follows_zipf():
    torch.manual_seed(0)
    ids = log_uniform_sample(200_000, 50)
    assert ids.min() >= 0 and ids.max() <= 49
    freq = torch.bincount(ids, minlength=50).double() / ids.numel()
    expected = log_uniform_log_prob(torch.arange(50), 50).exp()
    assert expected.sum().item() == pytest.approx(1.0)
    assert torch.allclose(freq, expected, atol=4e-3)


def reference_sampled_loss(head, hidden, targets, cands):
    """Sampled softmax written out token by token, as an independent check of the vectorized code."""
    w, b = head.weight.weight, head.bias.weight.squeeze(-1)
    logq = math.log(head.num_sampled) + log_uniform_log_prob(torch.arange(head.vocab_size), head.vocab_size)
    losses = []
    for h, t in zip(hidden, targets, strict=True):
        logits = [h @ w[t] + b[t] - logq[t]]
        logits += [h @ w[c] + b[c] - logq[c] for c in cands if c != t]  # accidental hits removed
        losses.append(-torch.log_softmax(torch.stack(logits), 0)[0])
    return torch.stack(losses).mean()


def test_sampled_softmax_matches_reference_and_masks_hits():
    torch.manual_seed(0)
    head = SampledSoftmax(vocab_size=30, dim=8, num_sampled=10).double()
    torch.nn.init.normal_(head.bias.weight)
    hidden = torch.randn(20, 8, dtype=torch.float64)
    targets = torch.arange(20) % 4  # small ids: the Zipf proposal draws them often, so hits happen
    torch.manual_seed(5)
    cands = log_uniform_sample(10, 30)
    assert (cands.unsqueeze(0) == targets.unsqueeze(1)).any(), "test needs an accidental hit"
    torch.manual_seed(5)
    loss = head(hidden, targets)
    loss.backward()
    assert torch.isfinite(head.weight.weight.grad).all()
    assert loss.item() == pytest.approx(reference_sampled_loss(head, hidden, targets, cands.tolist()).item())


def test_sampled_softmax_same_seed_same_candidates_and_loss():
    head = SampledSoftmax(vocab_size=1000, dim=8, num_sampled=50)
    hidden, targets = torch.randn(6, 8), torch.randint(0, 1000, (6,))
    torch.manual_seed(7)
    a = head(hidden, targets)
    torch.manual_seed(7)
    b = head(hidden, targets)
    c = head(hidden, targets)  # RNG advanced: new candidates
    assert a.item() == b.item() and a.item() != c.item()
    torch.manual_seed(7)
    first = head.sample_candidates()
    torch.manual_seed(7)
    assert torch.equal(first, head.sample_candidates())


def test_sampled_softmax_gradient_is_row_sparse():
    vocab = 500
    head = SampledSoftmax(vocab_size=vocab, dim=8, num_sampled=20)
    hidden, targets = torch.randn(5, 8), torch.tensor([3, 100, 250, 499, 3])
    torch.manual_seed(11)
    cands = head.sample_candidates()
    torch.manual_seed(11)
    head(hidden, targets).backward()
    touched = torch.zeros(vocab, dtype=torch.bool)
    touched[targets] = True
    touched[cands] = True
    for table in (head.weight.weight, head.bias.weight):
        rows_nonzero = table.grad.abs().sum(-1) > 0
        assert not rows_nonzero[~touched].any(), "an untouched row got gradient"
        assert rows_nonzero[targets].all()
    assert touched.sum() < vocab // 4  # the point: most of the table is untouched


def test_eval_mode_is_exact_full_softmax_and_draws_nothing():
    head = SampledSoftmax(vocab_size=200, dim=8, num_sampled=20).eval()
    torch.nn.init.normal_(head.bias.weight)
    hidden, targets = torch.randn(7, 8), torch.randint(0, 200, (7,))
    state = torch.get_rng_state()
    loss = head(hidden, targets)
    assert torch.equal(state, torch.get_rng_state())
    assert torch.allclose(loss, F.cross_entropy(head.full_logits(hidden), targets))

    model = make("lstm_lm", softmax="sampled").eval()
    inputs, tgt = batch("lstm_lm")
    expected = F.cross_entropy(model.logits(inputs).reshape(-1, V), tgt.reshape(-1))
    assert torch.allclose(model(inputs, tgt), expected)


def sgd(model, inputs, targets, steps, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        model(inputs, targets).backward()
        opt.step()


def test_lstm_sampled_training_reduces_full_softmax_loss():
    torch.manual_seed(0)
    model = LSTMLM(vocab_size=V, dim=16, hidden=32, softmax="sampled", num_sampled=30)
    seq = torch.arange(8).repeat(2, 3)  # 0..7 repeated: trivially predictable
    inputs, targets = seq[:, :-1], seq[:, 1:]
    model.eval()
    before = model(inputs, targets).item()
    model.train()
    sgd(model, inputs, targets, steps=30, lr=0.5)
    model.eval()
    after = model(inputs, targets).item()
    assert after < before - 1.0


@pytest.mark.parametrize("name,over", VARIANTS, ids=IDS)
def test_sgd_steps_reduce_loss(name, over):
    model = make(name, **over).eval()  # eval: the sampled heads report the exact loss
    inputs, targets = batch(name)
    before = model(inputs, targets).item()
    model.train()
    # the LSTM's gradient passes through the small-initialized head first, so it needs a bigger step
    sgd(model, inputs, targets, steps=12, lr={"classifier": 0.3, "lstm_lm": 3.0}.get(name, 0.5))
    after = model.eval()(inputs, targets).item()
    assert after < before * 0.9


def test_tied_embeddings_share_storage():
    tied, untied = make("transformer_lm", tie_embeddings=True), make("transformer_lm")
    assert tied.head.weight is tied.tok_emb.weight
    assert tied.head.weight.data_ptr() == tied.tok_emb.weight.data_ptr()
    assert count_parameters(untied) - count_parameters(tied) == V * BASE["dim"]


@pytest.mark.parametrize("name", ["transformer_lm", "lstm_lm"])
def test_earlier_logits_ignore_future_tokens(name):
    model = make(name).eval()
    inputs, _ = batch(name)
    changed = inputs.clone()
    changed[:, 7] = (changed[:, 7] + 1) % V
    a, b = model.logits(inputs), model.logits(changed)
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_transformer_rejects_too_long_input():
    model = make("transformer_lm")
    x = torch.zeros(1, T + 1, dtype=torch.long)
    with pytest.raises(ConfigError, match="seq_len"):
        model(x, x)


def test_count_parameters_classifier():
    model = DenseClassifier(in_features=10, hidden=6, layers=2, classes=3)
    assert count_parameters(model) == (10 * 6 + 6) + (6 * 6 + 6) + (6 * 3 + 3)
    assert [type(m).__name__ for m in model.net] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]


def test_build_model_passes_the_right_widths():
    tfm = make("transformer_lm")
    assert tfm.blocks[0].mlp.fc_in.out_features == 4 * BASE["dim"] and len(tfm.blocks) == 2
    assert make("transformer_lm", hidden=24).blocks[0].mlp.fc_in.out_features == 24
    lstm = make("lstm_lm", hidden=40)
    assert lstm.lstm.hidden_size == 40 and lstm.lstm.proj_size == BASE["dim"]
    assert isinstance(make("lstm_lm", softmax="sampled").head, SampledSoftmax)
    clf = make("classifier", hidden=33)
    assert clf.net[0].in_features == 20 and clf.net[-1].out_features == 7 and clf.net[0].out_features == 33
    assert set(MODELS) == {"transformer_lm", "lstm_lm", "classifier"}
    assert isinstance(tfm, TransformerLM) and isinstance(lstm, LSTMLM)


@pytest.mark.parametrize("name,over,words", [
    ("foo", {}, ["'foo'", "transformer_lm, lstm_lm, classifier"]),
    ("transformer_lm", {"softmax": "hier"}, ["'hier'", "full, sampled"]),
    ("lstm_lm", {"softmax": "hier"}, ["'hier'", "full, sampled"]),
    ("transformer_lm", {"dim": 18, "heads": 4}, ["18", "heads", "1, 2, 3, 6, 9, 18"]),
    ("transformer_lm", {"tie_embeddings": True, "softmax": "sampled"}, ["tie_embeddings", "full"]),
    ("lstm_lm", {"softmax": "sampled", "num_sampled": V}, ["num_sampled", str(V)]),
    ("lstm_lm", {"hidden": 16}, ["hidden", "dim"]),
    ("classifier", {"dropout": 1.0}, ["dropout", "[0, 1)"]),
])
def test_build_model_errors_name_key_and_choices(name, over, words):
    with pytest.raises(ConfigError) as err:
        make(name, **over)
    msg = str(err.value)
    assert "\n" not in msg
    for word in words:
        assert word in msg
