"""``python -m tessel.trial [--config FILE] [--out FILE] [KEY=VALUE ...]``: the planner's calibration trial
(:mod:`tessel.planner.calibrate`) of the config's model, as a torchrun worker on every host. Rank 0 writes the
gathered record as JSON to ``--out``, or prints it as one line. ``tessel train --plan auto`` runs it on its local
workers before planning; ``tessel bench plan`` once per cell and model."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from .config import load_config
from .mesh import shutdown
from .planner.calibrate import run_trial
from .resolve import job_of


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m tessel.trial")
    p.add_argument("--config")
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*")
    ns = p.parse_args(argv)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    trial = run_trial(job_of(load_config(ns.config, ns.overrides)))
    if dist.get_rank() == 0:
        if ns.out:
            Path(ns.out).write_text(json.dumps(trial))
        else:
            print(json.dumps(trial), flush=True)
    # As a training worker leaves (cli.main): the trial's DDP modules hold their groups through reference cycles,
    # and a gloo group alive at interpreter exit can abort the process ("terminate called without an active
    # exception", seen in the suite), which the launcher reads as a failed trial. The record is written: leave
    # the groups in order, then exit without running destructors.
    shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
