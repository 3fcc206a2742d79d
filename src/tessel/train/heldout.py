"""Held-out loss and accuracy of a run's weights, in one process, on samples no step trained on.

When ``tessel train`` ends, the launcher evaluates the run's initial weights (its seed) and its final
checkpoint, loaded into the plain model whatever the layout it was saved under, so a run shows what it
learned and not only its training loss. The embedded datasets are drawn per sample id, so ids far beyond any
a run reaches (``FIRST``) are held out; a text corpus of the user's has no held-out part and is skipped.

    tessel train --model classifier    # ends: held-out (1024 samples ...): loss ... -> ..., accuracy ...% -> ...%
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

FIRST, SAMPLES = 10_000_000, 1024  # sample ids no run trains on: a step reads global_batch ids after the last
CHUNK_LOGITS = 1 << 24  # logits computed at once (64 MiB in fp32): one sequence of 64 a chunk at a 200K vocabulary
ALL_LOGITS = 1 << 26  # at most this many logits in all, so a large vocabulary costs seconds, not minutes


def batch(data, first: int = FIRST, n: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the held-out samples."""
    return data.get_batch(np.arange(first, first + n))


@torch.no_grad()
def evaluate(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
             classes: int) -> dict[str, float]:
    """Mean cross-entropy and accuracy (% of classes or next tokens right) of ``model.logits`` on the samples,
    in chunks small enough for a large vocabulary.

    >>> class Scores(torch.nn.Module):   # its inputs are its logits
    ...     def logits(self, x):
    ...         return x
    >>> evaluate(Scores(), torch.tensor([[5.0, 0.0], [0.0, 5.0]]), torch.tensor([0, 0]), classes=2)
    {'loss': 2.5067..., 'accuracy': 50.0}
    """
    was = model.training
    model.eval()
    per_sample = max(1, targets[0].numel() * classes)
    step = max(1, CHUNK_LOGITS // per_sample)
    loss = right = 0.0
    for i in range(0, len(inputs), step):
        logits = model.logits(inputs[i:i + step]).float()
        y = targets[i:i + step]
        loss += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum"))
        right += float((logits.argmax(-1) == y).sum())
    model.train(was)
    return {"loss": loss / targets.numel(), "accuracy": 100 * right / targets.numel()}


def report(cfg) -> dict[str, dict[str, float]] | None:
    """Held-out loss and accuracy at the run's start and end (``{"initial": ..., "final": ..., "step": N}``),
    or None where there is no held-out data (a text corpus) or no final checkpoint."""
    if cfg.data_source == "text" or not cfg.checkpoint.enabled:
        return None  # before importing DCP (a second of the launcher's start-up) for nothing
    from . import checkpoint
    from .build import build, build_data

    final = checkpoint.latest(cfg.checkpoint_dir)
    if final is None:
        return None
    torch.manual_seed(cfg.train.seed)  # as the trainer does before it builds: the run's initial weights
    data = build_data(cfg)
    model = build(cfg, getattr(data, "vocab_size", 0))
    classes = cfg.model.classes if cfg.model.name == "classifier" else data.vocab_size
    per_sample = classes * (1 if cfg.model.name == "classifier" else cfg.data.seq_len)
    inputs, targets = batch(data, n=min(SAMPLES, max(1, ALL_LOGITS // per_sample)))  # 1024, or 5 x 64 tokens at 200K
    initial = evaluate(model, inputs, targets, classes)
    meta = checkpoint.read_meta(final)
    with warnings.catch_warnings():  # DCP's note that it reads into one process is what is meant here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        step = checkpoint.load_weights(final, model, {"model": meta["model"]})
    return {"initial": initial, "final": evaluate(model, inputs, targets, classes), "step": step,
            "samples": len(inputs)}  # sequences for a language model, whose accuracy is over their next tokens


def line(result: dict) -> str:
    """One line for the terminal.

    >>> line({"initial": {"loss": 4.6, "accuracy": 1.0}, "final": {"loss": 0.9, "accuracy": 74.6}, "step": 300,
    ...       "samples": 1024})
    'held-out (1024 samples no step trained on): loss 4.600 -> 0.900, accuracy 1.0% -> 74.6% (step 0 -> 300)'
    """
    a, b = result["initial"], result["final"]
    return (f"held-out ({result['samples']} samples no step trained on): loss {a['loss']:.3f} -> {b['loss']:.3f}, "
            f"accuracy {a['accuracy']:.1f}% -> {b['accuracy']:.1f}% (step 0 -> {result['step']})")


def add_to_summary(out: str | Path, result: dict) -> None:
    """Record the result in the run's summary.json, beside what the workers wrote."""
    path = Path(out) / "summary.json"
    if path.is_file():
        summary = json.loads(path.read_text())
        summary["heldout"] = result
        path.write_text(json.dumps(summary, indent=1))
