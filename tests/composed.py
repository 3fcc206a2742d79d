"""A config resolved as ``tessel train`` resolves it, for tests that drive the composer themselves."""

import torch.distributed as dist

from tessel.resolve import plan_of, settings_of


def planned(cfg, world: int | None = None):
    """(plan, settings) the config asks for on ``world`` ranks (default: this world), checked."""
    settings = settings_of(cfg)
    return plan_of(cfg, world or dist.get_world_size()).check(settings), settings


def check_before_workers(cfg, world: int | None = None):
    """What ``tessel train`` checks before any worker starts: the plan against the settings, then the plan against
    the model built on the meta device. Returns the plan; PlanError names the first reason it cannot run."""
    import torch

    from tessel.parallelize import check_model
    from tessel.train.build import build, build_data

    settings = settings_of(cfg)
    plan = plan_of(cfg, world or cfg.nproc).check(settings)
    vocab = getattr(build_data(cfg), "vocab_size", 0) if cfg.data_source != "gaussian" else 0
    with torch.device("meta"):
        model = build(cfg, vocab)
    check_model(model, plan, settings)
    return plan
