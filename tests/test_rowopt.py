"""Row optimizers (tessel.sparse.rowopt): torch's rule on touched rows, weight decay included, lazy elsewhere."""

import pytest
import torch

from tessel.choices import optimizer
from tessel.errors import ConfigError
from tessel.sparse.rowopt import RowOptimizer

LR, WD = 0.1, 0.1


def _torch(kind, param, momentum):
    if kind == "sgd":
        return torch.optim.SGD([param], lr=LR, momentum=momentum, weight_decay=WD)
    if kind == "adagrad":
        return torch.optim.Adagrad([param], lr=LR, weight_decay=WD)
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]([param], lr=LR, weight_decay=WD, eps=0.0)


@pytest.mark.parametrize("kind,momentum", [("sgd", 0.0), ("sgd", 0.9), ("adagrad", 0.0), ("adam", 0.0),
                                           ("adamw", 0.0)])
def test_weight_decay_equals_torch_when_every_row_is_touched(kind, momentum):
    torch.manual_seed(0)
    table = torch.randn(6, 3, dtype=torch.float64)
    param = torch.nn.Parameter(table.clone())
    ref = _torch(kind, param, momentum)
    # lazy Adam puts eps outside the bias correction (SparseAdam's form), torch's Adam inside: eps=0 compares rules
    opt = RowOptimizer(kind, LR, momentum=momentum, weight_decay=WD, eps=0.0 if "adam" in kind else None)
    state, rows = opt.init(table), torch.arange(6)
    for _ in range(4):
        g = torch.randn(6, 3, dtype=torch.float64)
        param.grad = g.clone()
        ref.step()
        opt.update(table, state, rows, g)
    torch.testing.assert_close(table, param.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind,momentum", [("sgd", 0.0), ("sgd", 0.9), ("adagrad", 0.0), ("adam", 0.0),
                                           ("adamw", 0.0)])
def test_untouched_rows_and_their_state_stay_as_they_were(kind, momentum):
    torch.manual_seed(1)
    table = torch.randn(5, 2, dtype=torch.float64)
    opt = RowOptimizer(kind, LR, momentum=momentum, weight_decay=WD)
    state = opt.init(table)
    # warm every row up first: with all-zero state a bug that decays every row's moments would go unseen
    opt.update(table, state, torch.arange(5), torch.randn(5, 2, dtype=torch.float64))
    before = table.clone()
    state_before = {k: v.clone() for k, v in state.items()}
    rows, untouched = torch.tensor([1, 3]), torch.tensor([0, 2, 4])
    opt.update(table, state, rows, torch.randn(2, 2, dtype=torch.float64))
    assert torch.equal(table[untouched], before[untouched]) and not torch.equal(table[rows], before[rows])
    for k, v in state.items():
        if v.dim():
            assert torch.equal(v[untouched], state_before[k][untouched]), k


def test_decay_rules_on_touched_rows_by_formula():
    w = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    g = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    rows = torch.tensor([0])
    sgd = w.clone()
    RowOptimizer("sgd", LR, weight_decay=WD).update(sgd, {}, rows, g)
    torch.testing.assert_close(sgd, w - LR * (g + WD * w), rtol=0, atol=1e-15)  # L2 into the gradient
    plain, decayed = w.clone(), w.clone()
    for t, wd in ((plain, 0.0), (decayed, WD)):
        opt = RowOptimizer("adamw", LR, weight_decay=wd)
        opt.update(t, opt.init(t), rows, g)
    # AdamW: the row shrinks by (1 - lr*wd) first; the Adam step itself does not see the decay
    torch.testing.assert_close(decayed - plain, -LR * WD * w, rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_without_decay_equals_torch_on_partially_touched_rows(kind):
    torch.manual_seed(2)
    table = torch.randn(6, 3, dtype=torch.float64)
    param = torch.nn.Parameter(table.clone())
    cls = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.SparseAdam}[kind]
    ref = cls([param], lr=LR)
    opt = RowOptimizer(kind, LR)
    state = opt.init(table)
    for rows in (torch.tensor([0, 2]), torch.tensor([2, 5]), torch.tensor([1, 2, 3])):
        g = torch.randn(len(rows), 3, dtype=torch.float64)
        param.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), g, table.shape) if kind == "adam" else \
            torch.zeros_like(table).index_add_(0, rows, g)
        ref.step()
        opt.update(table, state, rows, g)
    torch.testing.assert_close(table, param.detach(), rtol=0, atol=1e-12)


def test_kinds():
    assert optimizer("adamw").rows == "adamw" and optimizer("adam").rows == "adam"
    with pytest.raises(ConfigError, match="valid: sgd, adagrad, adam, adamw"):
        RowOptimizer("nosuch", 0.1)
