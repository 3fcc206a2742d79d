"""The ``tessel`` command.

    tessel train                              # default model and data on 2 local workers
    tessel train --nproc 4 --model lstm_lm --steps 100
    tessel train --config run.toml --train.lr 1e-3 --resume
    tessel train --print-config               # the resolved config as TOML
    tessel train --max-restarts 2 --ckpt-every 10   # a dead worker: every worker restarts and resumes
    tessel run --nproc 2 examples/prepare_loop.py ps  # your own script (tessel.prepare) on 2 workers
    torchrun --nnodes 2 --nproc-per-node 1 ... -m tessel train --config run.toml   # several nodes

Every ``section.key`` of the config is a flag (``--train.steps 10``); the short flags below are aliases.
Bad input prints one line ``tessel: error: ...`` and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from .bench import cli as bench_cli
from .cluster import cli as cluster_cli
from .config import Config, all_keys, load_config
from .errors import CommError, ConfigError, Preempted, TesselError
from .plan import ParallelPlan

# short flag -> config key (flags that take a value)
ALIASES = {
    "--model": "model.name", "--nproc": "parallel.nproc", "--dp": "parallel.dp", "--dp-shard": "parallel.dp_shard",
    "--pp": "parallel.pp",
    "--tp": "parallel.tp", "--tp-mode": "tensor.mode", "--tp-grid": "tensor.grid", "--steps": "train.steps",
    "--sparse": "sparse.strategy", "--batch": "train.global_batch",
    "--micro-batches": "train.micro_batches", "--lr": "train.lr", "--optimizer": "train.optimizer",
    "--momentum": "train.momentum", "--seed": "train.seed", "--dtype": "train.dtype", "--data": "data.path",
    "--vocab": "data.vocab_size",
    "--seq-len": "data.seq_len", "--out": "metrics.out", "--ckpt-dir": "checkpoint.dir",
    "--ckpt-every": "checkpoint.every", "--timeout": "parallel.timeout", "--plan": "plan.source",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit; we want one line
        if "unrecognized arguments" in message:
            message = f"unknown option(s) {message.split(':', 1)[1].strip()}; see 'tessel train --help'"
        raise ConfigError(message)


def _train_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help="train a model on local workers or as a torchrun worker",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_flags(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as TOML and exit")
    p.add_argument("--max-restarts", type=_restarts, default=0, metavar="N",
                   help="restart every worker up to N times after one dies or stalls; they continue from the "
                        "newest intact checkpoint (default 0)")
    p.add_argument("--verbose", action="store_true", help="keep torch's launcher logs")
    return p


def _plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="rank every parallel plan for a model on a topology; print the table",
                       description="tessel plan --nproc 8 --hosts 8 --link-mbit 200 [--json plan.json]: the "
                                   "train flags describe the model and batch; the degrees and schedule are chosen")
    _config_flags(p)
    p.add_argument("--hosts", type=_count, help="hosts the ranks fill in order (default 1: one machine)")
    p.add_argument("--link-mbit", type=float, help="link rate across hosts in Mbit/s (default TESSEL_LINK_MBIT)")
    p.add_argument("--memory-per-rank", help="memory a rank may hold, e.g. 4GiB or 512MiB (default unbounded)")
    p.add_argument("--latency-us", type=float, help="microseconds per ring step of a collective (default 200)")
    p.add_argument("--speed", type=float, help="a rank's compute relative to one core here (default: CPU budget)")
    p.add_argument("--trial", action="store_true", help="first time the model's steps and each kind of collective "
                   "on --nproc local workers and price with what they took (this machine's rates, not a cluster's)")
    p.add_argument("--allow-async", action="store_true", help="offer schedules that change the math")
    p.add_argument("--json", help="write the winner here, for tessel train --plan FILE")
    p.add_argument("--top", type=_count, default=5, help="rows of the best candidates shown (default 5)")
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)


def _config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file with [model] [data] [parallel] [train] [checkpoint] [sparse] "
                                    "[pipeline] [metrics]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key")
    short = p.add_argument_group("short flags (aliases of config keys)")
    for flag, key in ALIASES.items():
        short.add_argument(flag, dest=f"alias:{key}", metavar="V", help=key)
    full = p.add_argument_group("every config key")
    for key, typ, default in all_keys():
        full.add_argument(f"--{key}", dest=f"key:{key}", metavar=typ.__name__.upper(), help=f"default {default!r}")


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="run your own script (tessel.prepare) on local workers, as torchrun would")
    p.add_argument("--nproc", type=_count, default=2, help="worker processes (default 2)")
    p.add_argument("--max-restarts", type=_restarts, default=0, metavar="N", help="restart every worker up to N "
                   "times after one dies (the script resumes itself, e.g. with tessel.load)")
    p.add_argument("--verbose", action="store_true", help="keep torch's launcher logs")
    p.add_argument("script", help="the Python script every worker runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def _run(ns: argparse.Namespace) -> int:
    if not os.path.isfile(ns.script):
        raise ConfigError(f"script '{ns.script}' is not a file; give the path of the Python script to run")
    from .cluster.launch import launch

    return launch(ns.args, ns.nproc, verbose=ns.verbose, max_restarts=ns.max_restarts, program=(ns.script,))


def _memory(text: str | None) -> float:
    """'4GiB', '512MiB', '2.5GB' or a byte count -> GiB (0: unbounded)."""
    if not text:
        return 0.0
    from .cluster.emulate import parse_size

    value = parse_size(text)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--memory-per-rank '{text}' is not a size; give e.g. 4GiB, 512MiB or a byte count")
    return value / 2**30


def _plan_verb(ns: argparse.Namespace) -> int:
    """tessel plan: rank the candidates on the topology the flags describe, print, optionally save the winner."""
    from .planner import calibrate
    from .resolve import job_of, topology_of

    cfg = config_from_args(ns)
    ranks = cfg.nproc
    extra = {"hosts": ns.hosts or cfg.plan.hosts,
             "memory_gib": _memory(ns.memory_per_rank) or cfg.plan.memory_gib,
             "allow_async": ns.allow_async or cfg.plan.allow_async}
    for flag, key, value in (("link-mbit", "link_mbit", ns.link_mbit), ("latency-us", "latency_us", ns.latency_us),
                             ("speed", "speed", ns.speed)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--{flag} {value} is not valid; give a positive finite number")
        extra[key] = value or getattr(cfg.plan, key)
    for k, v in extra.items():
        setattr(cfg.plan, k, v)
    if cfg.nproc % (cfg.plan.hosts or 1):
        raise ConfigError(f"--hosts {cfg.plan.hosts} does not divide --nproc {cfg.nproc}; every host holds as many "
                          "ranks as the others")
    trial = _local_trial(cfg) if ns.trial else None
    planned = calibrate.choose_calibrated(job_of(cfg), lambda cal: topology_of(cfg, ranks, calibration=cal), trial,
                                          cfg.plan.allow_async)
    print(planned.table(ns.top))
    if ns.json:
        Path(ns.json).write_text(planned.best.plan.to_json() + "\n")
        print(f"wrote {ns.json}: tessel train --nproc {ranks} --plan {ns.json}")
    return 0


def _planned(cfg: Config, argv: list[str]) -> tuple[Config, list[str], ParallelPlan]:
    """tessel train --plan auto|FILE in the launcher: the plan the workers will follow, and as many workers as it
    has ranks; for auto the planner runs here, once, its table is printed and the winner saved beside the run,
    and the workers are given that file (a file's plan is followed exactly as it says, whatever the flags)."""
    from .planner import calibrate
    from .resolve import job_of, saved_plan_for, topology_of

    if cfg.plan.source != "auto":
        plan = saved_plan_for(cfg, cfg.parallel.nproc)
        cfg.parallel.nproc = plan.world
        return cfg, [*argv, "--nproc", str(plan.world)], plan
    trial = _local_trial(cfg) if cfg.plan.trial else None
    planned = calibrate.choose_calibrated(job_of(cfg), lambda cal: topology_of(cfg, cfg.nproc, calibration=cal),
                                          trial, cfg.plan.allow_async)
    print(planned.table(), flush=True)
    path = Path(cfg.metrics.out) / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(planned.best.plan.to_json() + "\n")
    cfg.parallel.nproc, cfg.plan.source = planned.best.plan.world, str(path)
    return cfg, [*argv, "--plan", str(path), "--nproc", str(cfg.nproc)], planned.best.plan


def _local_trial(cfg: Config) -> dict | None:
    """The planner's calibration trial on as many local workers as the run will start (torch's launcher), or None
    with one line where it fails."""
    import tempfile

    from .cluster.launch import launch
    from .planner import calibrate

    with tempfile.TemporaryDirectory(prefix="tessel-trial-") as d:
        conf, out = Path(d) / "config.toml", Path(d) / "trial.json"
        conf.write_text(cfg.to_toml())

        def run() -> dict:
            rc = launch(["--config", str(conf), "--out", str(out)], cfg.nproc, program=("-m", "tessel.trial"))
            if rc:
                raise RuntimeError(f"its {cfg.nproc} workers exited with code {rc}")
            return json.loads(out.read_text())

        return calibrate.attempt(run)


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a process count; give an integer >= 1")
    return n


def _restarts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a count; give an integer >= 0")
    return n


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tessel", description="Train one PyTorch model across many workers.")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    _train_parser(sub)
    _plan_parser(sub)
    _run_parser(sub)
    cluster_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    return p


def config_from_args(ns: argparse.Namespace) -> Config:
    overrides = []
    for dest, value in vars(ns).items():
        if value is not None and (dest.startswith("alias:") or dest.startswith("key:")):
            overrides.append(f"{dest.split(':', 1)[1]}={value}")
    overrides += ns.set
    if ns.resume:
        overrides.append("checkpoint.resume=true")
    return load_config(ns.config, overrides)


def _leave_worker(code: int) -> int:
    """In a worker that is done (failed, or finished and torn down), exit at once with ``code``.

    After a failed collective, gloo's threads and DDP's reducer can block interpreter exit for a long
    time, and a process group left alive can abort the process at exit ("terminate called without an
    active exception"), which would turn exit 2 into a crash; the job is over either way.
    """
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _fail(message: str, code: int) -> int:
    """Report a failure once: a worker hands it to its launcher through torchelastic's error file."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        with open(error_file, "w") as f:
            json.dump({"message": message, "timestamp": int(time.time())}, f)
    else:
        print(message, file=sys.stderr)
    return code


def _heldout(cfg) -> None:
    """What the run learned, on samples it never saw: its initial and final weights in one process."""
    from .train import heldout

    result = heldout.report(cfg)
    if result is not None:
        print(heldout.line(result), flush=True)
        heldout.add_to_summary(cfg.metrics.out, result)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = parser().parse_args(argv)
        if ns.verb == "cluster":
            return cluster_cli.main(ns)
        if ns.verb == "bench":
            return bench_cli.main(ns, argv)
        if ns.verb == "run":
            return _run(ns)
        if ns.verb == "plan":
            return _plan_verb(ns)
        cfg = config_from_args(ns)
        if ns.print_config:
            print(cfg.to_toml())
            return 0
        from .cluster.launch import in_worker

        if in_worker():
            from .mesh import shutdown
            from .trainer import run

            run(cfg)
            # Without an orderly teardown gloo's threads can abort the process at exit ("terminate called
            # without an active exception", seen once in dozens of pipelined runs, after the last step and the
            # checkpoint): every rank first leaves its last collective, then the groups go, then the process
            # exits without running the destructors of whatever else still holds gloo state.
            shutdown()
            return _leave_worker(0)
        from .preflight import preflight

        plan = None
        if cfg.plan.source:
            cfg, argv, plan = _planned(cfg, argv)
        preflight(cfg, plan=plan)
        from .cluster.launch import launch

        code = launch(argv, cfg.nproc, verbose=ns.verbose, max_restarts=ns.max_restarts)
        if code == 0 and cfg.metrics.heldout:
            _heldout(cfg)
        return code
    except TesselError as e:
        return _leave_worker(_fail(f"tessel: error: {e}", 2))
    except CommError as e:
        return _leave_worker(_fail(f"tessel: {e}", 1))
    except Preempted as e:
        return _leave_worker(_fail(f"tessel: {e}", 143))
    except KeyboardInterrupt:
        print("tessel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
