"""The command line: one-line errors with exit code 2, resume equality, dead and stuck workers."""

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import trained
from tessel.cli import main
from tessel.train import checkpoint
from trained import train

# the plot and the held-out evaluation (a second or two of a launch each) are on where a test looks at them
TINY = ["--model.dim", "16", "--model.layers", "1", "--model.heads", "2", "--vocab", "200", "--seq-len", "8",
        "--batch", "8", "--metrics.progress", "log", "--metrics.memory", "false", "--metrics.plot", "false",
        "--metrics.heldout", "false"]


def tessel(*args, cwd, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "tessel", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("tessel: error: ")
    for n in needles:
        assert n in err, err
    return err


def test_config_errors(capsys, tmp_path):
    one_line_error(capsys, ["train", "--nproc", "3", "--dp", "2"], "dp=2 x pp=1 x tp=1 = 2", "world size 3")
    one_line_error(capsys, ["train", "--batch", "10", "--micro-batches", "2"], "global batch 10", "dp=2")
    one_line_error(capsys, ["train", "--model", "resnet"], "model.name", "transformer_lm, lstm_lm, classifier")
    one_line_error(capsys, ["train", "--train.stepz", "3"], "--train.stepz")
    one_line_error(capsys, ["train", "--steps", "ten"], "train.steps", "int")
    one_line_error(capsys, ["train", "--pp", "5", "--nproc", "5"], "pp=5", "valid: pp <= 4")
    one_line_error(capsys, ["train", "--pp", "2", "--pipeline.split", "3,3"], "pipeline.split '3,3'", "e.g. '2,2'")
    one_line_error(capsys, ["train", "--pp", "2", "--pipeline.schedule", "zb"], "pipeline.schedule", "async-predict")
    one_line_error(capsys, ["train", "--tp", "4", "--tp-mode", "2d", "--model.softmax", "sampled"],
                   "model.softmax=sampled with tp-mode 2d", "valid: --tp-mode 1d, or model.softmax=full")
    one_line_error(capsys, ["train", "--tp", "2", "--tp-mode", "1d", "--sparse.tables", "pos_emb=ps,nosuch=ps"],
                   "nosuch")
    one_line_error(capsys, ["train", "--pp", "2", "--pipeline.schedule", "async-predict", "--optimizer", "adagrad"],
                   "adagrad", "valid: train.optimizer sgd")
    one_line_error(capsys, ["train", "--parallel.device", "tpu"], "parallel.device", "auto, cpu, cuda")
    one_line_error(capsys, ["train", "--parallel.backend", "nccl", "--parallel.device", "cpu"],
                   "parallel.device is 'cpu'", "parallel.backend gloo")
    if not torch.cuda.is_available():
        one_line_error(capsys, ["train", "--parallel.device", "cuda"], "parallel.device 'cuda'",
                       "valid here: auto, cpu")
    toml = tmp_path / "run.toml"
    toml.write_text("[train]\nsteps = 5\nbogus = 1\n")
    one_line_error(capsys, ["train", "--config", str(toml)], "train.bogus", "train.steps")
    toml.write_text("[trainer]\nsteps = 5\n")
    one_line_error(capsys, ["train", "--config", str(toml)], "trainer", "valid sections")
    one_line_error(capsys, ["train", "--config", str(tmp_path / "nope.toml")], "does not exist")


def test_data_errors(capsys, tmp_path):
    cache = ["--data.cache_dir", str(tmp_path / "cache")]
    one_line_error(capsys, ["train", "--data", str(tmp_path / "missing*.txt"), *cache], "missing*.txt")
    (tmp_path / "empty.txt").write_text("")
    one_line_error(capsys, ["train", "--data", str(tmp_path / "empty.txt"), *cache], "empty.txt", "empty")
    (tmp_path / "bin.txt").write_bytes(b"hello \xff\xfe world")
    one_line_error(capsys, ["train", "--data", str(tmp_path / "bin.txt"), *cache], "bin.txt", "UTF-8")


def test_checkpoint_errors(capsys, world2, tmp_path):
    out = tmp_path / "run"
    one_line_error(capsys, ["train", "--resume", "--out", str(out), *TINY], "no intact checkpoint")
    train(world2, tmp_path, "--steps", "4", "--ckpt-every", "2", "--out", str(out), *TINY)
    one_line_error(capsys, ["train", "--resume", "--out", str(out), *TINY, "--model.dim", "8"],
                   "another model", "dim")
    one_line_error(capsys, ["train", "--resume", "--out", str(out), *TINY, "--tp", "2"],
                   "may change dp and the tp mode, not pp or tp")
    one_line_error(capsys, ["train", "--resume", "--out", str(out), *TINY, "--optimizer", "nadamw"],
                   "holds the state of train.optimizer adamw; this run's is nadamw")
    # a damaged file in the newest checkpoint: found before anything is read, and the older one is used
    ckpt = out / "checkpoints"
    shard = ckpt / "step-00000004" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:40])
    _, printed = train(world2, tmp_path, "--resume", "--steps", "6", "--out", str(out), *TINY)
    assert (f"tessel: checkpoint '{ckpt / 'step-00000004'}' skipped (renamed to *.damaged): file __1_0.distcp has 40 "
            "bytes" in printed and "tessel: resuming from step 2" in printed), printed
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000002", "step-00000004.damaged", "step-00000006"]
    # none intact: one line naming each and why
    (ckpt / "step-00000006" / ".metadata").write_bytes(b"garbage")
    (ckpt / "step-00000002" / "tessel.json").write_text("{}")
    one_line_error(capsys, ["train", "--resume", "--out", str(out), *TINY], "no intact checkpoint",
                   "step-00000006: file .metadata has 7 bytes", "step-00000002: its tessel.json records no file")


def _load(path: Path, tmp: Path) -> dict:
    dst = tmp / (path.parent.parent.name + ".pt")
    dcp_to_torch_save(str(path), str(dst))
    return torch.load(dst, weights_only=False)


def _assert_identical(a, b, where=""):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def _resumed_equals_uninterrupted(tmp_path, args, world=None):
    """6 steps with checkpoints every 3 == the step-3 checkpoint resumed for 3 more steps: in fresh workers
    (launched), or in ``world``'s ranks after they ran the whole (trained.py: the same trainer, no launch).
    Returns (final state, step-3 state, full run dir, resumed run dir)."""
    def run(*more):
        if world is not None:
            return train(world, tmp_path, *args, *more)
        r = tessel("train", *args, *more, cwd=tmp_path)
        assert r.returncode == 0, r.stderr

    full = tmp_path / "full"
    run("--ckpt-every", "3", "--checkpoint.keep", "5", "--out", str(full))
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step-00000003", part / "checkpoints" / "step-00000003")
    run("--resume", "--out", str(part))
    a = _load(full / "checkpoints" / "step-00000006", tmp_path)
    _assert_identical(a, _load(part / "checkpoints" / "step-00000006", tmp_path))
    return a, _load(full / "checkpoints" / "step-00000003", tmp_path), full, part


@pytest.mark.parametrize("sparse", ["dense", "ps", "alltoall", "auto"])
def test_resume_is_bit_identical(tmp_path, sparse, request):
    """6 steps uninterrupted == the step-3 checkpoint resumed for 3 more steps, in the test world's workers (auto:
    the resumed run keeps the saved plan, whatever the link probe says this time). Fresh workers resuming a run
    whose tables alltoall serves (the default) are tests/test_elastic.py's restarts after kill and SIGTERM."""
    args = [*TINY, "--model", "lstm_lm", "--model.softmax", "sampled", "--model.num_sampled", "32",
            "--optimizer", "adam", "--steps", "6", "--sparse", sparse]
    a, before, full, part = _resumed_equals_uninterrupted(tmp_path, args, request.getfixturevalue("world2"))
    # replaced tables are saved whole under the plain model's weight names, their row state beside them
    assert not torch.equal(before["model"]["embedding.weight"], a["model"]["embedding.weight"])
    assert sparse == "auto" or ("tables" in a) == (sparse != "dense")
    if "tables" in a:
        assert "exp_avg" in " ".join(a["tables"])  # lazy Adam's row state is saved too
    plans = [checkpoint.read_meta(d / "checkpoints" / "step-00000006")["plan"]["tables"] for d in (full, part)]
    assert plans[0] == plans[1] and {t["name"] for t in plans[0]} == {"embedding", "head.weight", "head.bias"}


@pytest.mark.parametrize("schedule,extra", [
    ("1f1b", ["--optimizer", "sgd"]), ("async-predict", ["--optimizer", "sgd"]),
    # the optimizer's own guess reads Adam's moments and step count, and PipeMare's LR the step: all resumed
    ("async-predict", ["--optimizer", "adamw", "--pipeline.predict", "opt", "--pipeline.delay_lr", "4"])])
def test_pipeline_resume_is_bit_identical(world2, tmp_path, schedule, extra):
    """pp=2: each stage saves its own parameters under the model's names; a resumed run keeps the saved
    stage bounds and (async) restarts from the drained pipeline exactly as the uninterrupted run does."""
    args = [*TINY, "--model", "classifier", "--model.layers", "3", "--model.hidden", "32", "--pp", "2",
            "--micro-batches", "2", *extra, "--steps", "6", "--pipeline.schedule", schedule]
    a, before, full, _ = _resumed_equals_uninterrupted(tmp_path, args, world2)
    summary = json.loads((full / "summary.json").read_text())
    pipe = summary["pipeline"]
    assert pipe["schedule"] == schedule and pipe["plan_bounds"][0][0] == 0
    # receive waits, by whom: the first stage never awaits an activation, the last never a gradient
    first, last = (pipe["stage_of_rank"].index(k) for k in (0, 1))
    assert pipe["wait_activation_per_rank"][first] == 0.0 and pipe["wait_grad_per_rank"][last] == 0.0
    assert pipe["wait_activation_per_rank"][last] > 0.0 and pipe["wait_grad_per_rank"][first] > 0.0
    # both stages' parameters, under the plain model's names
    assert {k for k in a["model"] if k.endswith("weight")} == {"net.0.weight", "net.2.weight", "net.4.weight",
                                                                "net.6.weight"}
    assert not torch.equal(before["model"]["net.0.weight"], a["model"]["net.0.weight"])


def test_loss_logged_by_the_rank_holding_the_last_stage(world2, tmp_path):
    """torch's ZBV schedule puts the last of 4 stages on pp rank 0, beside the first: that rank logs the loss."""
    args = [*TINY, "--model", "classifier", "--model.layers", "3", "--model.hidden", "32", "--pp", "2",
            "--micro-batches", "2", "--optimizer", "sgd", "--steps", "2", "--pipeline.schedule", "torch-zbv",
            "--checkpoint.enabled", "false", "--out", str(tmp_path / "run")]
    train(world2, tmp_path, *args)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert len(losses) == 2 and all(x > 1.0 for x in losses)  # 8 classes: about ln 8, not 0


def _workers(launcher_pid: int) -> dict[int, int]:
    """local rank -> pid of the tessel workers below ``launcher_pid``."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        pid, ppid = int(d.name), int(stat.rsplit(")", 1)[1].split()[1])
        local = [e for e in env if e.startswith(b"LOCAL_RANK=")]
        if local and ppid == launcher_pid:
            found[int(local[0].split(b"=")[1])] = pid
    return found


def _start_and_wait_for_steps(tmp_path, *extra):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tessel", "train", *TINY, "--steps", "100000", "--out", str(out),
                             "--checkpoint.enabled", "false", *extra], cwd=tmp_path, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            workers = _workers(proc.pid)
            if len(workers) == 2:
                return proc, workers
        time.sleep(0.2)
    proc.kill()
    pytest.fail("training did not start")


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_dead_or_stuck_worker_ends_job(tmp_path, how):
    proc, workers = _start_and_wait_for_steps(tmp_path, "--timeout", "5")
    t0 = time.monotonic()
    os.kill(workers[1], signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if how == "stop":
            try:
                os.kill(workers[1], signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert time.monotonic() - t0 < 60
    assert proc.returncode != 0
    if how == "kill":
        assert "rank 1" in err and "SIGKILL" in err, err
    else:
        assert "timed out" in err and "rank 0" in err, err


def test_plain_torchrun_two_nodes(tmp_path):
    """The same entry point is a worker under torchrun: two single-process nodes, c10d rendezvous."""
    from world import free_port

    port, procs = free_port(), []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t2n",
               "--rdzv-conf", f"is_host={int(node == 0)}", "-m", "tessel", "train", *TINY, "--steps", "3",
               "--out", str(tmp_path / "run")]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dims"].startswith("dp=2") and summary["steps_run"] == 3
    assert summary["bytes"]["dp.dense"]["sent_per_step_per_rank"] > 0


def test_train_on_text_files(tmp_path, world2, monkeypatch, capsys):
    """tessel train's main on a user's corpus, its 2 workers the ranks of a test world."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the cat sat on the mat and the dog ate the bone while the bird sang".split()
    for i in range(2):
        (corpus / f"part{i}.txt").write_text(" ".join(words[(j * 7 + i) % len(words)] for j in range(3000)))
    out = tmp_path / "run"
    trained.launch_in([world2], tmp_path, monkeypatch)
    assert main(["train", *TINY, "--model", "lstm_lm", "--model.hidden", "32", "--model.softmax", "full", "--steps",
                 "30", "--lr", "0.02", "--train.warmup", "0", "--data", str(corpus / "*.txt"), "--metrics.plot", "true",
                 "--metrics.heldout", "true", "--data.cache_dir", str(tmp_path / "cache"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_loss"] < summary["first_loss"] - 0.5
    printed = capsys.readouterr().out
    assert "heldout" not in summary and "held-out" not in printed  # the user's corpus has no held-out part
    assert (out / "loss.png").stat().st_size > 1000
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 30 and "dp.dense" in json.loads(lines[-1])["bytes"]
    # every step: the logging rank's resident memory now and glibc's bytes in use, so growth shows over a run
    last = json.loads(lines[-1])
    assert 50 * 2**20 < last["rss"] < 8 * 2**30 and 0 < last["heap"] < last["rss"] and 0 < last["anon"] < last["rss"]


def test_train_reports_held_out_loss_and_accuracy(world2, tmp_path, capsys, monkeypatch):
    """After the run, its initial and final weights on samples no step trained on: a learnable task's held-out
    accuracy rises and its loss falls (the launcher's part, the final checkpoint loaded into one process, after 2
    workers: the ranks of a test world)."""
    out = tmp_path / "run"
    args = ["--model", "classifier", "--model.layers", "2", "--model.hidden", "32", "--model.in_features", "16",
            "--model.classes", "4", "--batch", "16", "--optimizer", "sgd", "--lr", "0.1", "--steps", "30",
            "--metrics.progress", "off", "--metrics.plot", "false", "--out", str(out)]
    trained.launch_in([world2], tmp_path, monkeypatch)
    assert main(["train", *args]) == 0
    held = json.loads((out / "summary.json").read_text())["heldout"]
    assert held["step"] == 30 and held["samples"] == 1024
    assert held["final"]["accuracy"] > held["initial"]["accuracy"] + 20
    assert held["final"]["loss"] < held["initial"]["loss"]
    printed = capsys.readouterr().out
    shown = [line for line in printed.splitlines() if line.startswith("held-out (1024 samples")]
    assert len(shown) == 1 and f"{held['final']['accuracy']:.1f}%" in shown[0], printed


@pytest.mark.parametrize("strategy,channel", [("ps", "ps.push"), ("alltoall", "a2a.bwd")])
def test_sparse_loop_example_runs(world2, strategy, channel):
    """The example's loop on the ranks of a test world (the two processes torchrun would start; torchrun itself:
    test_plain_torchrun_two_nodes)."""
    printed = world2.run(trained.run_example, "sparse_loop", strategy)[0]
    assert f"-> {strategy} (sparse)" in printed and f"'{channel}'" in printed, printed


def test_readme_library_example_runs(world2):
    printed = world2.run(trained.run_example, "own_loop")[0]
    params = 32 * 64 + 64 + 64 + 1
    # ring all_reduce over 2 ranks: each rank sends 2(P-1)/P = 1x the gradient bytes per step
    assert f"dp.dense sent per step {params * 4} bytes" in printed, printed


def test_pipeline_accuracy_protocol_runs(tmp_path, monkeypatch, capsys, world1, world4):
    """The accuracy protocol end to end on a tiny budget: every schedule trains, is evaluated on held-out
    samples from its checkpoint, and the flushed pipeline matches the single process it must equal. Each run is
    `tessel train`'s own main, its workers the ranks of a test world (the launcher has its own tests)."""
    protocol = _protocol(monkeypatch)
    trained.main_in([world1, world4], tmp_path, monkeypatch, protocol)
    monkeypatch.chdir(tmp_path)
    trained.script_main(protocol, ["--tasks", "classifier", "--seeds", "0", "--steps", "6", "--micro", "1",
                                   "--variants", "opt:4", "--baselines", "1f1b", "--out", str(tmp_path / "acc")],
                        monkeypatch)
    printed = capsys.readouterr().out
    res = json.loads((tmp_path / "acc" / "results.json").read_text())["classifier"]
    # async and async-stash go through the same train-and-evaluate lines as these (left out: a run each)
    assert res["steps"] == 6 and set(res["m1"]) == {"single", "1f1b", "async-predict-opt-delay4"}
    assert res["split"] == "2,1,1,2" and set(res["m1-lr"].values()) == {"0.05"}  # the pinned cut, the task's LR
    assert abs(res["m1"]["1f1b"][0]["loss"] - res["single"][0]["loss"]) < 1e-4
    assert "| async-predict-opt-delay4 |" in printed and "async-predict-opt-delay4 vs 1f1b: " in printed
    run = tmp_path / "acc" / "classifier-m1-async-predict-opt-delay4-6-cut2112-s0"  # runs named by cut
    plan = json.loads((run / "summary.json").read_text())["plan"]
    assert (plan["predict"], plan["delay_lr"]) == ("opt", 4)
    trained.script_main(protocol, ["--report-only", str(tmp_path / "acc" / "results.json")], monkeypatch)
    assert capsys.readouterr().out == (tmp_path / "acc" / "report.md").read_text() + "\n"  # the report from its results


def _protocol(monkeypatch):
    """examples/pipeline_accuracy.py as a module."""
    return trained.example("pipeline_accuracy", monkeypatch)


def test_accuracy_tables_in_the_docs_render_from_the_committed_results(monkeypatch):
    """Every table row and paired test of a committed protocol run (bench/pipeline-accuracy/*.json, each run's
    per-seed losses and accuracies) renders to the text docs/pipeline.md prints, so each number there can be
    recomputed from the repo."""
    root = Path(__file__).resolve().parent.parent
    docs, render = (root / "docs" / "pipeline.md").read_text(), _protocol(monkeypatch).render
    committed = sorted((root / "bench" / "pipeline-accuracy").glob("*.json"))
    assert committed
    for path in committed:
        lines = [ln for ln in render(json.loads(path.read_text())).splitlines() if ln.startswith(("| ", "- "))]
        assert len(lines) > 4 and [ln for ln in lines if ln not in docs] == [], path.name


_PAIRED = re.compile(r"^- (\S+) vs (\S+): ([+-]\d+\.\d+)% \(([+-]\d+\.\d+) to ([+-]\d+\.\d+)\), p([=<])(\d\.\d+)$")


def _accuracy_tables(text: str):
    """Each protocol table in the docs: its reference run, {run: (printed cells, per-seed losses)} and the paired
    tests printed under it whose two runs are rows of it."""
    lines = text.splitlines() + [""]
    for i, line in enumerate(lines):
        if not line.startswith("| run | loss mean ± std | vs "):
            continue
        rows, j = {}, i + 2
        while lines[j].startswith("| "):
            cells = [c.strip() for c in lines[j].strip("|").split("|")]
            rows[cells[0]] = (cells, [float(v) for v in cells[5].split(",")])
            j += 1
        tests = []
        while j < len(lines) and not lines[j].startswith(("| run |", "#")):
            if (m := _PAIRED.match(lines[j])) and m[1] in rows and m[2] in rows:
                tests.append(m)
            j += 1
        yield line.split("|")[3].strip().removeprefix("vs "), rows, tests


def test_every_accuracy_table_in_the_docs_recomputes_from_its_printed_per_seed_losses():
    """The loss columns and paired tests of every protocol table in docs/pipeline.md follow from the per-seed losses
    it prints, to their rounding, including the tables of 2026-11-25 whose runs' JSON was never kept (their
    per-seed accuracies cannot be recomputed). Written here with scipy, not the example's code."""
    from scipy import stats

    found = list(_accuracy_tables((Path(__file__).resolve().parent.parent / "docs" / "pipeline.md").read_text()))
    assert len(found) >= 18 and sum(len(t) for *_, t in found) >= 103  # the parse found every table
    for ref, rows, tests in found:
        ref_mean = statistics.mean(rows[ref][1])
        for name, (cells, loss) in rows.items():
            mean, sd = (float(v) for v in cells[1].split("±"))
            # a mean of values rounded to 4 places is within 1e-4 of the rounded mean of the values
            assert abs(statistics.mean(loss) - mean) <= 1.01e-4 and abs(statistics.stdev(loss) - sd) <= 1.5e-4, name
            assert abs((statistics.mean(loss) / ref_mean - 1) * 100 - float(cells[2].rstrip("%"))) <= 0.03, name
        for m in tests:
            gaps = np.array(rows[m[1]][1]) / np.array(rows[m[2]][1]) - 1
            lo, hi = stats.t.interval(0.95, len(gaps) - 1, loc=gaps.mean(), scale=stats.sem(gaps))
            assert np.allclose([gaps.mean() * 100, lo * 100, hi * 100], [float(m[3]), float(m[4]), float(m[5])],
                               rtol=0, atol=0.06), m[0]
            if hi - lo < 0.002:  # gaps of a few 1e-4 are as large as the 4-place rounding: their p is not recomputable
                continue
            p = stats.ttest_1samp(gaps, 0.0).pvalue
            assert p < 0.0015 if m[6] == "<" else abs(p - float(m[7])) < 0.02, m[0]


# docs/pipeline.md "Every variant on every task": each cell's results file, run and reference, per (task, micro-batches)
_SUMMARY = {
    ("classifier", "1"): {"v1": "classifier-opt-grid", "opt": "classifier-opt-grid",
                          "opt:1200": "classifier-opt-grid", "v1:1200": "classifier-m1-pipemare"},
    ("classifier", "4"): {"v1": "classifier-opt-grid", "opt": "classifier-opt-grid", "opt:1200": "classifier-opt-grid"},
    ("transformer_text", "1"): {"v1": "text-m1-grid", "opt:1200": "text-m1-grid-pipemare",
                                "v1:1200": "text-m1-grid-pipemare", "opt": "text-m1-opt", "nag": "text-m1-nag"},
    ("transformer_text", "4"): {v: "text-m4-grid" for v in ("v1", "opt", "opt:1200", "nag")},
    ("transformer_lm", "1"): {"v1": "zipf-m1-grid", **{v: "zipf-m1-opt" for v in ("opt", "opt:1200", "v1:1200")},
                              "nag": "lm-m1-nag"},
    ("transformer_lm", "4"): {v: "zipf-m4-grid" for v in ("v1", "opt", "opt:1200", "v1:1200", "nag")},
}


def test_the_docs_summary_of_every_variant_recomputes_from_the_committed_results():
    """Each cell of the summary table is the paired gap (mean, 95% t interval) of that run's per-seed losses over
    its reference's in the results file named above."""
    from scipy import stats

    root = Path(__file__).resolve().parent.parent
    lines = (root / "docs" / "pipeline.md").read_text().splitlines()
    head = lines.index("| task | micro-batches | v1 | opt | opt:1200 | v1:1200 | nag |")
    variants = lines[head].strip("|").split("|")[2:]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[head + 2:head + 8]]
    assert [(r[0], r[1]) for r in rows] == list(_SUMMARY)
    for task, m, *cells in rows:
        for variant, cell in zip((v.strip() for v in variants), cells):
            if variant not in _SUMMARY[task, m]:
                assert cell == "–", (task, m, variant)
                continue
            run = {"nag": "async-nag"}.get(variant, "async-predict-" + variant.replace(":", "-delay"))
            res = json.loads((root / "bench" / "pipeline-accuracy" / f"{_SUMMARY[task, m][variant]}.json").read_text())
            seeds = res[task][f"m{m}"]
            ref = "single" if cell.endswith("vs single") else "1f1b"
            gaps = np.array([r["loss"] for r in seeds[run]]) / np.array([r["loss"] for r in seeds[ref]]) - 1
            lo, hi = stats.t.interval(0.95, len(gaps) - 1, loc=gaps.mean(), scale=stats.sem(gaps))
            want = f"{gaps.mean() * 100:+.2f}% ({lo * 100:+.2f} to {hi * 100:+.2f})".replace("-", "−")
            assert cell.removesuffix(" vs single") == want, (task, m, variant)


def test_pipeline_accuracy_gives_each_run_its_best_lr_on_the_plateau_seeds(monkeypatch):
    """--lrs: each schedule takes the grid's LR with the lowest mean held-out loss over seeds 0 and 1; 1f1b
    takes single's (their updates are equal), without runs of its own."""
    protocol = _protocol(monkeypatch)
    loss = {("single", "3e-3"): 2.0, ("single", "1e-3"): 1.9, ("async", "3e-3"): 3.0, ("async", "1e-3"): 3.1}
    asked = []

    def trial(name, lr, seed):
        asked.append((name, lr, seed))
        return {"loss": loss[name, lr] + (0.3 if (name, lr, seed) == ("async", "3e-3", 1) else 0.0)}

    log = []
    # async: 3.0 and 3.3 (mean 3.15) at 3e-3 against 3.1 at 1e-3
    assert protocol.pick_lrs(["single", "1f1b", "async"], ["3e-3", "1e-3"], trial, log) == {
        "single": "1e-3", "1f1b": "1e-3", "async": "1e-3"}
    assert sorted(asked) == sorted((n, lr, s) for n in ("single", "async") for lr in ("3e-3", "1e-3") for s in (0, 1))
    assert len(log) == 2 and log[1].endswith("-> lr 1e-3")
    asked.clear()  # an LR fixed for a run (--run-lrs) is taken as given: no trial of it, and 1f1b follows single's
    assert protocol.pick_lrs(["single", "1f1b", "async"], ["3e-3", "1e-3"], trial, log, {"single": "3e-3"}) == {
        "single": "3e-3", "1f1b": "3e-3", "async": "1e-3"}
    assert {n for n, _, _ in asked} == {"async"}
    # a run that diverged at an LR (held-out loss NaN) is the worst there, wherever the grid lists it
    loss["async", "3e-3"] = float("nan")
    assert protocol.pick_lrs(["async"], ["3e-3", "1e-3"], trial, log)["async"] == "1e-3"
    # the Nesterov method: its optimizer flushed in one process, and stale under PipeDream's stashing
    runs = protocol.schedules(["nag-flushed:0.08", "nag:0.08"], 1, "2,2,1,1", {"1f1b"})
    assert list(runs) == ["1f1b", "single-nag-psi0.08", "async-nag-psi0.08"]
    assert runs["single-nag-psi0.08"] == [*protocol.SINGLE, *protocol.NAG, "train.momentum_decay=0.08"]
    assert "pipeline.schedule=async-stash" in runs["async-nag-psi0.08"]


TP = [*TINY, "--nproc", "4", "--tp", "4", "--dtype", "float64", "--optimizer", "adamw", "--steps", "6"]


def test_tensor_parallel_resume_and_switch_mode(world4, world1, tmp_path):
    """3-D 2x1x2: resume is bit-identical; the same step-3 checkpoint resumed as 2-D 2x2 (DCP reshards the
    weights and Adam's state) ends where the uninterrupted 3-D run ends; a one-process run starts from it."""
    args = [*TP, "--tp-mode", "3d", "--tp-grid", "2x1x2"]
    final, _, full, _ = _resumed_equals_uninterrupted(tmp_path, args, world4)
    summary = json.loads((full / "summary.json").read_text())
    assert summary["tensor"] == "3d 2x1x2" and summary["bytes"]["tp"]["sent_per_step_per_rank"] > 0
    switched = tmp_path / "switched"
    shutil.copytree(tmp_path / "part" / "checkpoints" / "step-00000003", switched / "checkpoints" / "step-00000003")
    train(world4, tmp_path, *TP, "--tp-mode", "2d", "--resume", "--out", str(switched))
    other = _load(switched / "checkpoints" / "step-00000006", tmp_path)
    for name, value in final["model"].items():
        torch.testing.assert_close(other["model"][name], value, rtol=0, atol=1e-9, msg=name)
    single = tmp_path / "single"
    train(world1, tmp_path, *TINY, "--nproc", "1", "--dtype", "float64", "--steps", "1",
          "--checkpoint.init_from", str(full / "checkpoints"), "--out", str(single))
    started = _load(single / "checkpoints" / "step-00000001", tmp_path)["model"]["blocks.0.mlp.fc_in.weight"]
    fresh = _load(full / "checkpoints" / "step-00000003", tmp_path)["model"]["blocks.0.mlp.fc_in.weight"]
    assert (started - final["model"]["blocks.0.mlp.fc_in.weight"]).abs().max() < (
        started - fresh).abs().max()  # one step away from the trained weights, not from a fresh start


def test_tensor_parallel_errors(capsys):
    one_line_error(capsys, ["train", *TP, "--tp-mode", "3d", "--tp-grid", "2x2"], "tensor.grid '2x2' is invalid",
                   "e.g. '2x2x1'")
    one_line_error(capsys, ["train", *TP, "--model", "lstm_lm"], "not lstm_lm")
    one_line_error(capsys, ["train", *TP, "--tp-mode", "1d"], "2 attention heads do not split over 4 ranks")
    one_line_error(capsys, ["train", *TP, "--tp-mode", "4d"], "tensor.mode", "valid: 1d, 2d, 3d, torch-1d")


def test_the_command_line_imports_no_dtensor_before_a_run_needs_it():
    """DTensor, DCP and FSDP (with torch._dynamo, which imports them) cost a process 40 MiB and most of a second:
    a refusal, ``--help`` and a worker before its optimizer is made import none of them (torch's optimizers and
    DDP import torch._dynamo themselves; sharded weights, torch's tensor parallelism and checkpoints import them
    where used)."""
    code = ("import sys, tessel.cli, tessel.trainer, tessel.parallelize, tessel.materialize, tessel.prepare, "
            "tessel.pipeline.runtime, tessel.planner; print(sorted(m for m in ('torch.distributed.tensor', "
            "'torch.distributed.checkpoint', 'torch.distributed.fsdp', 'torch._dynamo') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
