"""Checkpoints: atomic saves (a crash mid-save leaves the previous one loadable), pruning, safe loading."""

import json
import os
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


def _saved(root, steps=(4, 9)):
    m, opt = _model()
    data = {"position": 1, "dp_size": 1, "global_batch": 8}
    for step in steps:
        checkpoint.save(root, step, m, opt, data, {**META, "run": "r1"}, keep=5)
    return m, opt


def test_latest_and_meta(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    _saved(tmp_path)
    (tmp_path / "step-00000012.tmp").mkdir()  # a save that never finished
    (tmp_path / "latest").write_text("step-00000099")  # the pointer is for people; loading goes by checksums
    assert checkpoint.latest(tmp_path).name == "step-00000009"
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nope", *_model(), META)
    (tmp_path / "step-00000004" / "tessel.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="no readable tessel.json"):
        checkpoint.read_meta(tmp_path / "step-00000004")


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", [_flip, _truncate])
@pytest.mark.parametrize("name", ["__0_0.distcp", ".metadata", "tessel.json"])
def test_damaged_file_is_found_before_use_and_the_older_checkpoint_is_taken(tmp_path, name, damage):
    from tessel.train.integrity import newest_intact, problem
    from tessel.train.resume import find_start

    _saved(tmp_path)
    newest = tmp_path / "step-00000009"
    assert problem(newest) is None
    damage(newest / name)
    why = problem(newest)
    assert why and (name in why or "tessel.json" in why), why
    path, skipped = newest_intact(tmp_path)
    assert path.name == "step-00000004" and skipped == [(newest, why)]
    with pytest.raises(CheckpointError, match="is damaged"):  # never read, even when named directly
        checkpoint.load(newest, *_model(), {**META, "run": "r1"})
    start = find_start(tmp_path, resume=True, restarted=False)
    assert start.path.endswith("step-00000004") and "skipped (renamed to *.damaged)" in start.notes()[0]
    damage(tmp_path / "step-00000004" / name)
    with pytest.raises(CheckpointError, match="no intact checkpoint.*step-00000009: .*step-00000004: "):
        find_start(tmp_path, resume=True, restarted=False)


def test_a_restart_resumes_only_its_own_run(tmp_path):
    from tessel.train.resume import RUN_FILE, find_start

    _saved(tmp_path)  # an earlier run's checkpoints, run id "r1"
    fresh = find_start(tmp_path, resume=False, restarted=False)
    assert fresh.path is None and (tmp_path / RUN_FILE).read_text() == fresh.run != "r1"
    # restarted before this run's first checkpoint: start over, not from the other run's step 9
    assert find_start(tmp_path, resume=False, restarted=True).path is None
    (tmp_path / RUN_FILE).write_text("r1")
    assert find_start(tmp_path, resume=False, restarted=True).path.endswith("step-00000009")
    resumed = find_start(tmp_path, resume=True, restarted=False)  # --resume takes any run's and keeps its id
    assert resumed.path.endswith("step-00000009") and resumed.run == "r1"


def test_pruning_keeps_the_last_k_of_this_run_only(tmp_path):
    m, opt = _saved(tmp_path, steps=(50,))  # an earlier run's
    data = {"position": 1, "dp_size": 1, "global_batch": 8}
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, m, opt, data, {**META, "run": "r2"}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003", "step-00000050"]


def test_planted_pickle_is_refused_and_never_run(tmp_path):
    """A .metadata that calls os.system when unpickled, with tessel.json resealed to match (as an attacker
    who rewrote the folder would): torch's own reader runs it; tessel refuses it in one line."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    from tessel.train.integrity import META as TJSON
    from tessel.train.integrity import seal

    _saved(tmp_path, steps=(1,))
    folder, marker = tmp_path / "step-00000001", tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    (folder / ".metadata").write_bytes(pickle.dumps(Payload()))
    meta = json.loads((folder / TJSON).read_text())
    (folder / TJSON).write_text(json.dumps(seal({k: v for k, v in meta.items() if k not in ("files", "meta_sha256")},
                                                folder)))
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(folder, *_model(), {**META, "run": "r1"})
    assert "asks to call posix.system" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()
    try:
        FileSystemReader(str(folder)).read_metadata()  # the planted file is live: plain DCP runs it
    except Exception:
        pass
    assert marker.exists()


def test_how_to_step_is_the_loading_runs_choice_not_the_saving_runs(tmp_path):
    """A run on plain tensors steps with torch's fused kernel; one whose weights are DTensors (FSDP2, torch's
    tensor parallelism) cannot. torch's optimizer state carries those flags in its parameter groups, so a
    checkpoint saved by the first, resumed by the second, would hand it the fused kernel; loading keeps the
    loading optimizer's own."""
    m, _ = _model()
    fused = torch.optim.AdamW(m.parameters(), lr=0.1, fused=True)
    m(torch.randn(3, 4)).sum().backward()
    fused.step()
    checkpoint.save(tmp_path, 1, m, fused, {"position": 1, "dp_size": 1, "global_batch": 8}, {**META, "run": "r1"})
    fresh, _ = _model()
    looping = torch.optim.AdamW(fresh.parameters(), lr=0.1, foreach=False)
    looping.step()  # (state to load into, as a resuming run has)
    checkpoint.load(checkpoint.latest(tmp_path), fresh, looping, {**META, "run": "r1"})
    assert [(g["fused"], g["foreach"]) for g in looping.param_groups] == [(None, False)]
    assert torch.equal(looping.state[next(fresh.parameters())]["exp_avg"], fused.state[next(m.parameters())]["exp_avg"])
