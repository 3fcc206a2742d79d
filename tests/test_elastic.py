"""Training that survives: a killed worker, or one told to stop, and the job still ends as if uninterrupted.

Local processes only (no namespaces), so CI always runs these; tests/test_chaos.py does the same on the
emulated cluster with stalls and a whole host lost.
"""

import os
import signal
import subprocess
import sys
import time

from test_cli import TINY, _assert_identical, _load, _workers

STEPS, EVERY = 40, 4
ARGS = [*TINY, "--steps", str(STEPS), "--ckpt-every", str(EVERY), "--checkpoint.keep", "3", "--optimizer", "adam"]


def _run_with_fault(tmp_path, name, at_step, rank, sig, *extra):
    """Start a run, signal ``rank``'s worker once metrics.jsonl reaches ``at_step``; (exit code, stderr, out)."""
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "tessel", "train", *ARGS, "--out", str(out), *extra],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= at_step:
            workers = _workers(proc.pid)
            if rank in workers:
                os.kill(workers[rank], sig)
                break
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=180)
    return proc.returncode, stdout + stderr, out


def _steps_logged(out) -> list[int]:
    import json

    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_killed_or_stopped_worker_restarts_and_ends_bit_identical(tmp_path):
    """--max-restarts: after kill -9 of a worker, every worker restarts and resumes this run's newest checkpoint
    without --resume; after SIGTERM to one worker, every rank stops after the same step with a checkpoint there
    (off the every-N cadence) and the restart goes on from exactly that step. Both end with the weights and
    optimizer state of an uninterrupted run, and every step's record once in metrics.jsonl."""
    from test_cli import tessel

    r = tessel("train", *ARGS, "--out", str(tmp_path / "full"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    last = f"checkpoints/step-{STEPS:08d}"
    want = _load(tmp_path / "full" / last, tmp_path)

    code, log, out = _run_with_fault(tmp_path, "killed", 10, 1, signal.SIGKILL, "--max-restarts", "2")
    assert code == 0, log
    assert "tessel: restart 1: continuing from step " in log, log
    resumed = int(log.split("continuing from step ")[1].split()[0])
    assert 0 < resumed < STEPS and resumed % EVERY == 0
    assert _steps_logged(out) == list(range(1, STEPS + 1))  # records of recomputed steps appear once
    _assert_identical(want, _load(out / last, tmp_path))

    code, log, out = _run_with_fault(tmp_path, "term", 6, 1, signal.SIGTERM, "--max-restarts", "1")
    assert code == 0, log
    stopped = int(log.split("stopped by SIGTERM after step ")[1].split(";")[0])
    assert f"continuing from step {stopped} " in log, log  # nothing recomputed
    assert _steps_logged(out) == list(range(1, STEPS + 1))
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
