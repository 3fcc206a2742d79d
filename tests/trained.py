"""``tessel train ARGS`` as its workers run it (the same ``trainer.run``), on the ranks of a persistent test world.

A launch gives every worker a fresh interpreter and a torch import, 7 to 10 s on two cores, so the tests that
check what a run does (resume, a switched layout, a checkpoint loaded elsewhere) train here. The tests of what the
launcher owns (fresh workers, restarts, dead ranks, exit codes, one line from a failed worker) still launch.

    summary, printed = train(world2, tmp_path, "--steps", "6", "--out", str(tmp_path / "run"))
"""

from __future__ import annotations

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
