"""Training that survives: a killed worker, or one told to stop, and the job still ends as if uninterrupted.

Local processes only (no namespaces), so CI always runs these; tests/test_chaos.py does the same on the
emulated cluster with stalls and a whole host lost.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from tessel.config import load_config
from tessel.errors import PlanError
from tessel.resolve import settings_of
from tessel.trainer import _plan_for_world
from test_cli import TINY, _assert_identical, _load, _workers
from trained import train

STEPS, EVERY = 40, 4
# tables served by alltoall (auto's usual pick here, named so the restarts always resume a prefetching table)
ARGS = [*TINY, "--steps", str(STEPS), "--ckpt-every", str(EVERY), "--checkpoint.keep", "3", "--optimizer", "adam",
        "--sparse", "alltoall"]


def _run_with_faults(tmp_path, name, faults, *extra):
    """Start a run; for each (step, rank, signal) in ``faults``, in order, signal that rank's worker once
    metrics.jsonl reaches the step; (exit code, stderr, out)."""
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "tessel", "train", *ARGS, "--out", str(out), *extra],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, pending = time.monotonic() + 150, list(faults)
    while pending and time.monotonic() < deadline:
        at_step, rank, sig = pending[0]
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= at_step:
            workers = _workers(proc.pid)
            if rank in workers:
                os.kill(workers[rank], sig)
                pending.pop(0)
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=180)
    assert not pending, f"faults not sent: {pending}"
    return proc.returncode, stdout + stderr, out


def _steps_logged(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_killed_or_stopped_worker_restarts_and_ends_bit_identical(world2, tmp_path):
    """--max-restarts: after kill -9 of a worker, every worker restarts and resumes this run's newest checkpoint
    without --resume; after SIGTERM to one worker, every rank stops after the same step with a checkpoint there
    (off the every-N cadence) and the restart goes on from exactly that step. Both end with the weights and
    optimizer state of an uninterrupted run, and every step's record once in metrics.jsonl."""
    summary, printed = train(world2, tmp_path, *ARGS, "--out", str(tmp_path / "full"))  # the reference, no faults
    # the scheduled alltoall tables say where their part of a step went: the waits by kind and their own work
    assert set(summary["sparse_waits_per_step"]) <= {"ids", "rows", "late_rows", "grads"}, summary
    assert {"rows", "grads"} <= set(summary["sparse_waits_per_step"]) and summary["sparse_work_per_step"] > 0
    assert "tables' time    waited for " in printed, printed
    last = f"checkpoints/step-{STEPS:08d}"
    want = _load(tmp_path / "full" / last, tmp_path)

    # one run, both faults: the kill at step 10, then (its restart running) SIGTERM at step 26
    code, log, out = _run_with_faults(tmp_path, "faults", [(10, 1, signal.SIGKILL), (26, 1, signal.SIGTERM)],
                                      "--max-restarts", "2")
    assert code == 0, log
    assert "tessel: restart 1: continuing from step " in log, log
    resumed = int(log.split("restart 1: continuing from step ")[1].split()[0])
    assert 0 < resumed <= 10 and resumed % EVERY == 0
    stopped = int(log.split("stopped by SIGTERM after step ")[1].split(";")[0])
    assert stopped >= 26 and f"restart 2: continuing from step {stopped} " in log, log  # nothing recomputed
    assert _steps_logged(out) == list(range(1, STEPS + 1))  # records of recomputed steps appear once
    _assert_identical(want, _load(out / last, tmp_path))


def check_stop_agreement():
    import torch.distributed as dist

    from tessel.train.preempt import StopOnSignal

    stop, answers = StopOnSignal(), []
    for step in range(6):
        if step == 2 and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is told, in the middle of step 2
        answers.append(stop.requested())
    stop.close()
    return answers, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_on_one_rank_stops_every_rank_after_the_same_step(world2):
    (a, restored_a), (b, restored_b) = world2.run(check_stop_agreement)
    assert a == b == [False, False, False, True, True, True]
    assert restored_a and restored_b


def test_job_reformed_on_fewer_then_more_ranks_continues_the_trajectory(world1, world2, tmp_path):
    """A 2-rank fp64 run with ps-served tables (lazy Adam row state on 2 shards), its step-3 checkpoint resumed on
    one rank to step 6, and that one's step 6 resumed on 2 ranks again: DCP reshards model, optimizer and tables
    each time; the one rank reads the global batch of 8 as 2 micro-batches of the saved 4 samples (both drawing the
    step's one set of sampled-softmax candidates, as 2 dp ranks do), and every step's loss and the final weights,
    tables and row state match the uninterrupted 2-rank run within 1e-9."""
    args = [*TINY, "--model", "lstm_lm", "--model.softmax", "sampled", "--model.num_sampled", "32", "--optimizer",
            "adam", "--sparse", "ps", "--dtype", "float64", "--steps", "9", "--ckpt-every", "3", "--checkpoint.keep",
            "5"]

    def run(name, nproc, start_from=None):  # in the test worlds (trained.py)
        out = tmp_path / name
        if start_from is not None:
            (out / "checkpoints").mkdir(parents=True)
            shutil.copytree(start_from, out / "checkpoints" / start_from.name)
        resume = ["--resume"] if start_from is not None else []
        _, printed = train({1: world1, 2: world2}[nproc], tmp_path, *args, *resume, "--nproc", str(nproc),
                           "--out", str(out))
        return out, printed

    full, _ = run("full", 2)
    one, log = run("one", 1, full / "checkpoints" / "step-00000003")
    assert "dp 2 -> 1 with the global batch kept: 2 micro-batches per rank" in log, log
    two, log = run("two", 2, one / "checkpoints" / "step-00000006")
    assert "micro-batches per rank" not in log  # 4 samples per rank again: one micro-batch, as saved at first
    loss = {d.name: {r["step"]: r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())}
            for d in (full, one, two)}
    resumed = {**loss["one"], **loss["two"]}
    assert sorted(resumed) == list(range(4, 10)), loss
    assert max(abs(resumed[s] - loss["full"][s]) for s in resumed) < 1e-9, loss
    want, got = (_load(d / "checkpoints" / "step-00000009", tmp_path) for d in (full, two))
    for part in ("model", "tables"):
        assert set(want[part]) == set(got[part])
        for name, w in want[part].items():
            if torch.is_tensor(w):
                torch.testing.assert_close(got[part][name], w, rtol=0, atol=1e-9, msg=f"{part} {name}")


def test_a_layout_that_cannot_shrink_says_so_in_one_line(monkeypatch):
    """A restarted job whose world re-formed too small for its pp x tp (3 hosts of 2 ranks, pp=3 x tp=2, one host
    lost: world 4) is refused with one line naming the re-formed world and what to change; a first start keeps
    the plain reason."""
    cfg = load_config(None, ["model.name=transformer_lm", "parallel.pp=3", "parallel.tp=2", "train.micro_batches=3",
                             "train.global_batch=12"])
    _plan = lambda cfg, world: _plan_for_world(cfg, world, settings_of(cfg))  # noqa: E731
    assert _plan(cfg, 6).dp == 1
    with pytest.raises(PlanError) as first:
        _plan(cfg, 4)
    assert "re-formed" not in str(first.value)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with pytest.raises(PlanError, match="re-formed on 4 ranks after restart 2.*not divisible by pp=3 x tp=2") as e:
        _plan(cfg, 4)
    assert "\n" not in str(e.value)
