"""Checkpoints: atomic saves (a crash mid-save leaves the previous one loadable), pruning, safe loading."""

import json
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from tessel.errors import CheckpointError
from tessel.train import checkpoint

META = {"model": {"name": "mlp", "dim": 4}}


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    return m, opt


def check_atomic_save(root):
    m, opt = _model()
    data = {"position": 5, "dp_size": dist.get_world_size(), "global_batch": 8}
    torch.manual_seed(123 + dist.get_rank())
    rng_at_save = torch.get_rng_state()
    checkpoint.save(root, 1, m, opt, data, META)
    saved = [p.detach().clone() for p in m.parameters()]
    torch.rand(5)  # move the RNG on; load must bring back this rank's state at save time
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)

    real_save = checkpoint.dcp.save

    def crash_after_writing(*a, **k):
        real_save(*a, **k)
        raise RuntimeError("simulated crash after the shards were written")

    with mock.patch.object(checkpoint.dcp, "save", crash_after_writing), pytest.raises(RuntimeError):
        checkpoint.save(root, 2, m, opt, data, META)
    dist.barrier()
    assert (root / "step-00000002.tmp").is_dir()  # the half-finished save is still there...
    assert checkpoint.latest(root).name == "step-00000001"  # ...and ignored

    fresh, fresh_opt = _model()
    step, ds = checkpoint.load(checkpoint.latest(root), fresh, fresh_opt, META)
    assert step == 1 and ds == data
    for a, b in zip(fresh.parameters(), saved):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert torch.equal(torch.get_rng_state(), rng_at_save)

    # the next good save replaces the stale .tmp, moves `latest`, and keeps only `keep` checkpoints
    checkpoint.save(root, 2, m, opt, data, META, keep=2)
    checkpoint.save(root, 3, m, opt, data, META, keep=2)
    assert not (root / "step-00000002.tmp").exists()
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000002", "step-00000003"]
    assert (root / "latest").read_text() == "step-00000003"

    with pytest.raises(CheckpointError, match="another model"):
        checkpoint.load(root / "step-00000003", *_model(), {"model": {"name": "mlp", "dim": 5}})
    return True


def test_crash_during_save_keeps_previous_checkpoint(world2, tmp_path):
    assert all(world2.run(check_atomic_save, tmp_path / "ckpt"))


def test_latest_and_meta(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    for name in ("step-00000004", "step-00000009"):
        d = tmp_path / name
        d.mkdir()
        (d / ".metadata").write_bytes(b"x")
        (d / "tessel.json").write_text(json.dumps({"step": int(name[-1])}))
    (tmp_path / "step-00000012.tmp").mkdir()
    (tmp_path / "latest").write_text("step-00000099")  # points nowhere: fall back to a scan
    assert checkpoint.latest(tmp_path).name == "step-00000009"
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nope", *_model(), META)
    (tmp_path / "step-00000004" / "tessel.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="no readable tessel.json"):
        checkpoint.read_meta(tmp_path / "step-00000004")
