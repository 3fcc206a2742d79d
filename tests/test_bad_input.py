"""Bad input, table-driven: each case is one line ``tessel: error: ...`` and exit 2 before any worker starts.

Every float key refuses NaN and infinity (a NaN passes every ``<`` check, so ``--train.clip nan`` used to turn
clipping off silently); the rest are what the config alone cannot know: the torch build, the file system,
the environment, the machine's memory. Leading ``NAME=value`` items of a case are environment variables, as
in a shell. Nothing may be launched: workers, benchmark runs and cluster hosts fail the test if reached.
"""

import pytest
import torch

from tessel.cli import main

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="nccl is valid where CUDA is")


def case(line: str, needle: str, marks=()):
    """A command line as typed after ``tessel`` (``{file}``, ``{folder}``, ``{corrupt}``: scratch paths) and a part
    of the one line it must print."""
    return pytest.param(line.split(), needle, marks=marks, id=line)


CASES = [
    case("train --lr nan", "config key 'train.lr' is nan; it must be a finite number >= 0"),
    case("train --parallel.timeout nan", "'parallel.timeout' is nan; it must be a finite number >= 1"),
    case("train --parallel.timeout inf", "'parallel.timeout' is inf"),
    case("train --timeout 1e300", "'parallel.timeout' is 1e+300; it must be from 1 to 604800"),
    case("train --train.clip nan", "'train.clip' is nan"),
    case("train --train.momentum nan", "'train.momentum' is nan"),
    case("train --sparse.max_touched nan", "'sparse.max_touched' is nan"),
    case("train --sparse.link_mbit=-inf", "'sparse.link_mbit' is -inf"),
    case("train --model.dropout nan", "'model.dropout' is nan"),
    case("train --model classifier --data.separation 0", "'data.separation' is 0.0; it must be >= 0.001"),
    case("train --seed 1e30", "'train.seed' is 1000000000000000019884624838656; it must be from 0 to"),
    case("train --parallel.backend nccl", "needs CUDA GPUs and a CUDA build of torch; this one has none; "
         "valid here: auto, gloo", marks=NO_CUDA),
    case("train --out {file}/sub", "metrics.out '{file}/sub' cannot be written (Not a directory)"),
    case("train --ckpt-dir {file}/ckpt", "checkpoint.dir '{file}/ckpt' cannot be written"),
    case("TESSEL_LINK_MBIT=fast train", "TESSEL_LINK_MBIT is 'fast'; it must be a positive finite number of Mbit/s"),
    case("TESSEL_LINK_MBIT=0 train", "TESSEL_LINK_MBIT is '0'"),
    case("train --plan {folder}/nosuch.json", "plan.source '{folder}/nosuch.json' is not a file; valid: auto"),
    case("train --plan {file}", "plan file '{file}' is not a parallel plan"),
    case("plan --nproc 4 --hosts 3", "--hosts 3 does not divide --nproc 4"),
    case("plan --link-mbit nan", "--link-mbit nan is not valid"),
    case("plan --latency-us -5", "--latency-us -5.0 is not valid"),
    case("plan --speed inf", "--speed inf is not valid"),
    case("plan --plan.latency_us nan", "'plan.latency_us' is nan"),
    case("plan --memory-per-rank lots", "--memory-per-rank 'lots' is not a size"),
    case("plan --memory-per-rank 1KiB --model.dim 16 --model.layers 1 --vocab 200", "no plan fits 2 ranks"),
    case("plan --plan.memory_gib inf", "'plan.memory_gib' is inf"),
    case("plan --plan.memory_headroom 1", "'plan.memory_headroom' is 1.0; it must be a share in [0, 1)"),
    case("plan --plan.memory_headroom nan", "'plan.memory_headroom' is nan"),
    case("plan --memory-per-rank 1KiB --plan.memory_headroom 0.2 --model.dim 16 --model.layers 1 --vocab 200",
         "budget of 1.0 KiB less the 20% kept free"),
    case("TESSEL_HOST_CPUS=x plan", "TESSEL_HOST_CPUS is 'x'"),
    case("train --model classifier --model.classes 1e11",
         "GiB to generate the class means), more than this machine's"),
    case("train --sparse.tables nosuch=ps", "'nosuch', which is not a table of this model; tables: tok_emb"),
    case("train --metrics.interface nosuch0", "metrics.interface 'nosuch0' is not a network interface of this "
                                               "host; valid: "),
    case("train --model resnet", "config key 'model.name' is 'resnet'; valid: transformer_lm"),
    case("train --train.beta1 1", "config key 'train.beta1' is 1.0; it must be in [0, 1)"),
    case("train --train.momentum_decay nan", "'train.momentum_decay' is nan"),
    case("train --sparse.optimizer nadamw", "'sparse.optimizer' is 'nadamw'; valid: auto, adamw, adam, sgd, adagrad"),
    case("train --sparse.tables tok_emb=torch-sparse", "sparse strategy 'torch-sparse' needs a torch optimizer that "
                                                       "takes sparse gradients; train.optimizer is 'adamw'"),
    case("train --nproc 2 --optimizer nadamw --sparse ps", "sparse ps with train.optimizer nadamw: no row optimizer "
                                                           "mirrors it"),
    case("train --nproc 2 --pp 2 --optimizer nadamw --pipeline.schedule async-predict",
         "cannot predict weights for nadamw"),
    case("train --nproc 3 --dp 2", "do not match the world size 3"),
    case("train --dp 3", "global batch 32 is not divisible by dp=3"),
    case("train --nproc 4 --dp-shard 3", "parallel.dp_shard=3 with dp=4: the dp ranks split into replicas of "
                                         "dp_shard ranks each, so dp_shard must divide dp; valid: 1, 2, 4 (or 0 = dp)"),
    case("train --nproc 4 --pp 2 --micro-batches 2 --dp-shard 0 --plan.memory_gib 0.0001 --pipeline.split 2,2",
         "plan dp=2 dp_shard=2 pp=2 tp=1 needs"),
    case("train --nproc 4 --pp 2 --micro-batches 2 --pipeline.schedule async --dp-shard 0",
         "parallel.dp_shard=2 with pipeline.schedule async: sharded stages run under tessel's flushed schedules"),
    case("train --dp-shard 0 --sparse torch-sparse --optimizer adagrad", "sparse torch-sparse with "
                                                                          "parallel.dp_shard=2"),
    case("train --dp-shard -1", "config key 'parallel.dp_shard' is -1; it must be >= 0"),
    case("train --parallel.grad_reduce fp16", "config key 'parallel.grad_reduce' is 'fp16'; valid: full, bf16"),
    case("train --parallel.ddp_comm torch --parallel.grad_reduce bf16", "torch's own bf16 hook needs NCCL on CUDA "
                                                                       "GPUs", marks=NO_CUDA),
    case("train --pp 2 --pipeline.delay_lr 5", "pipeline.delay_lr=5 rescales the LR of stale stages, which only an "
                                               "asynchronous pipeline has (pp=2, schedule 1f1b)"),
    case("train --pipeline.delay_lr -1", "config key 'pipeline.delay_lr' is -1; it must be >= 0"),
    case("train --pipeline.predict v3", "config key 'pipeline.predict' is 'v3'; valid: v1, v2, opt"),
    case("train --train.recompute full", "config key 'train.recompute' is 'full'; valid: none, layers, selective"),
    case("train --pp 2 --micro-batches 2 --pipeline.schedule async-predict --optimizer sgd --train.recompute layers",
         "train.recompute=layers with pipeline.schedule async-predict: the recomputed forward would run on the live "
         "weights"),
    case("train --tp 2 --tp-mode torch-1d --train.recompute selective", "train.recompute=selective with tensor.mode "
                                                                        "torch-1d"),
    case("train --dp-shard 0 --plan auto", "parallel.dp_shard=0 with plan.source auto: the planner decides sharding"),
    case("train --nosuch 1", "unknown option(s) --nosuch 1"),
    case("train --max-restarts -1", "give an integer >= 0"),
    case("run --nproc 0 {file}", "argument --nproc: '0' is not a process count; give an integer >= 1"),
    case("run --nproc nan {file}", "'nan' is not a process count"),
    case("run --max-restarts -1 {file}", "give an integer >= 0"),
    case("run {folder}/missing.py", "script '{folder}/missing.py' is not a file; give the path of the Python"),
    case("bench ddp --out {file}", "--out '{file}' is a file"),
    case("bench ddp --out {file}/sub", "--out '{file}/sub' cannot be created (Not a directory)"),
    case("bench ddp --append --out {corrupt}", "results.json is not a results file tessel wrote"),
    case("bench ddp --report-only --out {corrupt}", "results.json is not a results file tessel wrote"),
    case("bench ddp --report-only --reprice", "--reprice re-prices a saved planner check: use it with 'plan"),
    case("bench plan --report-only --out {corrupt}", "results.json is not a planner check tessel wrote"),
    case("bench plan --repeats 2 --out {folder}/p", "--repeats 2: the plan check judges the pick by an interval over "
                                                   "rounds; valid: 3 or more"),
    case("bench ddp --doc {folder}/missing/bench.md", "folder '{folder}/missing' does not exist"),
    case("bench ddp --doc {folder}", "it is a folder"),
    case("bench ddp --rates 1e400", "rate '1e400' is not understood"),
    case("bench ddp --cpu-period nan", "--cpu-period nan must be a number of ms from 1 to 1000"),
    case("bench ddp --cpu-period 0.5", "--cpu-period 0.5 must be a number of ms from 1 to 1000"),
    case("bench ddp --cpu-burst 20", "--cpu-burst 20 must be a number of ms from 0 to the period (10)"),
    case("bench ddp --nic-cpu -0.1", "--nic-cpu -0.1 must be 0 or a positive number of cores per host"),
    case("bench ddp --nic-cpu inf", "--nic-cpu inf must be 0 or a positive number of cores per host"),
    case("bench ddp --cpus inf", "--cpus inf must be a positive number of cores per host"),
    case("bench ddp --cpus 0", "--cpus 0 must be a positive number of cores per host"),
    case("cluster up --hosts 2 --cpus inf", "cpus must be a finite number of at least 0.1 per host"),
    case("cluster up --hosts 2 --cpus nan", "not nan"),
    case("cluster up --hosts 2 --cpus 0", "not 0.0"),
    case("cluster up --hosts 2 --cpus -1", "not -1.0"),
    case("cluster up --hosts 2 --rate 1e400", "rate '1e400' is not understood"),
]


def _unreachable(*args, **kwargs):
    raise AssertionError("bad input got past the checks")


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A scratch folder as the working directory, with nothing launchable: workers, bench runs, cluster hosts."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TESSEL_LINK_MBIT", raising=False)
    for target in ("tessel.cluster.launch.launch", "tessel.bench.runner.run_scenario",
                   "tessel.cluster.emulate.check_machine"):
        monkeypatch.setattr(target, _unreachable)
    (tmp_path / "file").write_text("x")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "results.json").write_text("{not json")
    return {"file": tmp_path / "file", "folder": tmp_path, "corrupt": tmp_path / "corrupt"}


@pytest.mark.parametrize("argv,needle", CASES)
def test_one_line_and_exit_2(argv, needle, place, capsys, monkeypatch):
    argv = [a.format(**place) for a in argv]
    while "=" in argv[0]:
        name, value = argv.pop(0).split("=", 1)
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tessel: error: "), err
    assert needle.format(**place) in err, err


@pytest.mark.parametrize("backend,said", [("nccl", "'nccl'"), ("auto", "'auto' (nccl on this CUDA machine)")])
def test_nccl_with_more_local_workers_than_gpus_is_one_line(backend, said, place, capsys, monkeypatch):
    """A host with one GPU (as the machine reports it): 2 nccl workers would both take device 0, which NCCL refuses
    only after both started; the launcher says so first. gloo may share the GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert main(["train", "--parallel.backend", backend, "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tessel: error: parallel.backend {said} gives each local worker a GPU of its own, and 2 workers "
                   "were asked for on a host with 1; valid: parallel.nproc <= 1, or parallel.backend gloo with "
                   "parallel.device cuda (workers share the GPUs)"), err


def test_a_refused_job_leaves_no_folders(place, capsys):
    # preflight makes the output folders to prove they can be written; a refusal must not leave them behind
    assert main(["train", "--sparse.tables", "nosuch=ps"]) == 2
    assert not (place["folder"] / "runs").exists()
