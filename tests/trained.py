"""``tessel train ARGS`` as its workers run it (the same ``trainer.run``), on the ranks of a persistent test world.

A launch gives every worker a fresh interpreter and a torch import, 7 to 10 s on two cores, so the tests that
check what a run does (resume, a switched layout, a checkpoint loaded elsewhere) train here. The tests of what the
launcher owns (fresh workers, restarts, dead ranks, exit codes, one line from a failed worker) still launch.

    summary, printed = train(world2, tmp_path, "--steps", "6", "--out", str(tmp_path / "run"))

``launch_in`` makes ``tessel.cli.main`` itself start its workers this way; examples are loaded as modules
(``example``), their launches swapped for these.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch.distributed as dist


def _rank(argv: list[str]) -> tuple[dict, str]:
    import contextlib
    import io

    from tessel.cli import config_from_args, parser
    from tessel.errors import TesselError
    from tessel.preflight import preflight
    from tessel.trainer import run

    cfg = config_from_args(parser().parse_args(["train", *argv]))
    assert cfg.nproc == dist.get_world_size(), f"--nproc {cfg.nproc} asked of a world of {dist.get_world_size()}"
    refused, printed = None, io.StringIO()
    with contextlib.redirect_stdout(printed):
        if dist.get_rank() == 0:  # what the launcher does before any worker starts: data cached, checkpoint verified
            try:
                preflight(cfg)
            except TesselError as e:
                refused = str(e)
        said = [None] * dist.get_world_size()
        dist.all_gather_object(said, refused)
        if said[0] is not None:
            raise AssertionError(f"tessel: error: {said[0]}")
        summary = run(cfg)
    return summary, printed.getvalue()


def train(world, cwd, *argv: str) -> tuple[dict, str]:
    """(the run's summary, what rank 0 printed, the launcher's checks included). Text data is cached under ``cwd``,
    as a launch from there would."""
    return world.run(_rank, [*argv, "--data.cache_dir", str(cwd / ".tessel_cache")], timeout=300)[0]


def launch_in(worlds, cwd, monkeypatch) -> None:
    """``tessel.cli.main(["train", ...])`` as it runs, its workers the ranks of the one of ``worlds`` as large as
    its --nproc (rank 0's output printed as a worker's would be): the launcher's own checks before and its held-out
    report after are the real ones. Other programs (the planner's trial) are launched as they are."""
    from tessel.cluster import launch as launching

    real = launching.launch

    def launch(argv: list[str], nproc: int, program=("-m", "tessel"), **kw) -> int:
        if program != ("-m", "tessel"):
            return real(argv, nproc, program=program, **kw)
        world = next(w for w in worlds if w.size == nproc)
        assert argv[0] == "train", argv
        print(train(world, cwd, *argv[1:])[1], end="")
        return 0

    monkeypatch.setattr(launching, "launch", launch)


def main_in(worlds, cwd, monkeypatch, module) -> None:
    """An example's ``launch(args)`` (``tessel ARGS`` in its own process) made ``tessel.cli.main(args)`` with its
    workers in ``worlds`` (``launch_in``)."""
    from tessel.cli import main

    def launch(args: list[str]) -> None:
        assert main(args) == 0, args

    launch_in(worlds, cwd, monkeypatch)
    monkeypatch.setattr(module, "launch", launch)


def example(name: str, monkeypatch=None, folder: str = "examples"):
    """examples/NAME.py (or FOLDER/NAME.py) as a module; with ``monkeypatch``, registered for the test (a dataclass
    in it looks its module up)."""
    path = Path(__file__).resolve().parent.parent / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def script_main(module, argv: list[str], monkeypatch) -> None:
    """An example's ``main()`` as ``python examples/NAME.py ARGV`` runs it: ``sys.argv`` set for the call."""
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    module.main()


def run_example(name: str, *args) -> str:
    """examples/NAME.py's ``main(*args)`` on this rank, as torchrun or ``tessel run`` starts it; what it printed."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        example(name).main(*args)
    return printed.getvalue()
