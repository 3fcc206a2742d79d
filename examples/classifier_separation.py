"""Held-out accuracy of `tessel train --model classifier`'s default run, for several class separations.

One process trains what the default run trains (2 x 2048 MLP, 1024 features, 100 classes, AdamW 3e-3 with
20 warm-up steps and cosine decay, clipping at 1.0, batch 32, 300 steps; data-parallel runs compute the same
updates) and evaluates 2048 samples no step trains on. It is how ``data.separation``'s default was chosen:

    python examples/classifier_separation.py 3 6 8
"""

import sys

import numpy as np
import torch
import torch.nn.functional as F

from tessel.data.classify import GaussianClassification
from tessel.models import DenseClassifier
from tessel.settings import Settings
from tessel.train.optim import set_lr


def run(separation: float, steps: int = 300, batch: int = 32) -> None:
    torch.manual_seed(0)
    data = GaussianClassification(1024, 100, seed=0, separation=separation)
    model = DenseClassifier(1024, 2048, 2, 100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, foreach=False)
    rule = Settings(steps=steps)  # tessel train's default LR rule: warm-up, then cosine
    hx, hy = data.get_batch(np.arange(10**9, 10**9 + 2048))  # far beyond every trained index
    losses = []
    for s in range(steps):
        set_lr(opt, rule.lr_at(s))
        x, y = data.get_batch(np.arange(s * batch, (s + 1) * batch))
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if s + 1 in (1, 100, 200, steps):
            with torch.no_grad():
                logits = model.logits(hx)  # (2048, 100)
            acc = (logits.argmax(1) == hy).float().mean().item()
            print(f"separation {separation:g} step {s + 1:3d}: train loss (last 10) {np.mean(losses[-10:]):.3f}  "
                  f"held-out loss {F.cross_entropy(logits, hy).item():.3f}  accuracy {acc:.1%}", flush=True)


if __name__ == "__main__":
    for value in sys.argv[1:] or ["6"]:
        run(float(value))
