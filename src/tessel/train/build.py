"""The plain model and dataset a config describes, and what a checkpoint must match to load into them.

    dataset = build_data(cfg)
    model = build(cfg, dataset.vocab_size)      # seeded by the caller: the same weights on every rank
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import Config
from ..data import build_dataset
from ..models import build_model


def build_data(cfg: Config):
    return build_dataset(
        cfg.data_source, vocab_size=cfg.data.vocab_size, seq_len=cfg.data.seq_len, seed=cfg.train.seed,
        zipf_s=cfg.data.zipf_s, path=cfg.data.path, cache_dir=cfg.data.cache_dir,
        in_features=cfg.model.in_features, classes=cfg.model.classes, separation=cfg.data.separation,
    )


def build(cfg: Config, vocab_size: int) -> torch.nn.Module:
    """The plain single-process model the config describes (seeded by the caller)."""
    m = cfg.model
    return build_model(
        m.name, vocab_size=vocab_size, seq_len=cfg.data.seq_len, dim=m.dim, hidden=m.hidden, layers=m.layers,
        heads=m.heads, dropout=m.dropout, tie_embeddings=m.tie_embeddings, softmax=m.softmax,
        num_sampled=m.num_sampled, in_features=m.in_features, classes=m.classes,
    )


def model_identity(cfg: Config, vocab_size: int, plan=None) -> dict[str, Any]:
    """What a checkpoint must match to be loaded into this run's model (``plan``: the run's, whose table policy
    it records; by default the config's)."""
    # ps/allgather tables are saved beside the model, not in it: resuming needs the same table plan.
    if plan is None:
        sparse = {k: getattr(cfg.sparse, k) for k in ("strategy", "tables", "max_touched")}
    else:
        p = plan.sparse
        sparse = {"strategy": p.strategy.name, "tables": ",".join(f"{n}={s.name}" for n, s in p.overrides),
                  "max_touched": p.max_touched}
    return {"model": {**cfg.to_dict()["model"], "vocab_size": vocab_size, "seq_len": cfg.data.seq_len,
                      "sparse": sparse}}
