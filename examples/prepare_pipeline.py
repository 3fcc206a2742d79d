"""Your own model and loop on a pipeline (and data parallelism around it) through ``tessel.prepare``.

The model is registered once with its layer chain (how to run it as a straight line of layers), so tessel
can cut it into stages; the loop then calls ``model.step(x, y)``, because a pipeline owns the order of the
micro-batches' forwards and backwards. The word table sits on the first stage and is served by rows over
that stage's data-parallel group.

    tessel run --nproc 2 examples/prepare_pipeline.py        # pp=2
    tessel run --nproc 4 examples/prepare_pipeline.py        # dp=2 x pp=2, the table served by ps
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tessel
from tessel import comm

WORDS, DIM, WIDTH, CLASSES, BATCH, STEPS = 5000, 32, 128, 10, 64, 30


class Topic(nn.Module):
    """Sentence (B, 12) word ids -> topic: mean of word vectors, then an MLP."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(WORDS, DIM)
        self.hidden = nn.Linear(DIM, WIDTH)
        self.deep = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, CLASSES)

    def forward(self, x, y):
        h = torch.relu(self.deep(torch.relu(self.hidden(self.words(x).mean(1)))))
        return F.cross_entropy(self.out(h), y)


# forward's own steps, one layer each: what a pipeline stage may hold (the loss follows the last)
tessel.register_model(Topic, chain=lambda m: tessel.Chain([
    tessel.Layer("words", ("words",), lambda r, x: r.words(x).mean(1)),  # (B, 12) ids -> (B, DIM)
    tessel.Layer("hidden", ("hidden",), lambda r, h: torch.relu(r.hidden(h))),  # (B, WIDTH)
    tessel.Layer("deep", ("deep",), lambda r, h: torch.relu(r.deep(h))),
    tessel.Layer("out", ("out",), lambda r, h: r.out(h)),  # (B, CLASSES) logits
], F.cross_entropy))


def batches(seed=0, n=STEPS):
    """The topic is which tenth of the vocabulary most words come from."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        y = torch.randint(0, CLASSES, (BATCH,), generator=g)
        x = (y[:, None] * (WORDS // CLASSES) + torch.randint(0, WORDS // CLASSES, (BATCH, 12), generator=g))
        noise = torch.rand(BATCH, 12, generator=g) < 0.3
        yield x.where(~noise, torch.randint(0, WORDS, (BATCH, 12), generator=g)), y


class Batches:  # re-iterable, as a DataLoader is
    def __iter__(self):
        return batches()


def main() -> None:
    torch.manual_seed(0)
    model = Topic()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = tessel.ParallelPlan(dp=max(1, world // 2), pp=2, micro_batches=4)  # the table: auto decides (dp > 1)
    model, optimizer, loader = tessel.prepare(model, optimizer, Batches(), plan=plan, max_norm=1.0)
    losses = []
    for x, y in loader:
        losses.append(float(model.step(x, y)))  # forwards, backwards, clipping and update: the global batch's loss
        moved = comm.counter.end_step()  # this step's bytes per channel
    # held-out batches, sliced over the ranks as the training ones: forwards alone, the global batch's loss
    held = [float(model.evaluate(x, y)) for x, y in loader.sliced(batches(seed=1, n=4))]
    if dist.get_rank() == 0:
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, held-out {sum(held) / len(held):.3f}; bytes rank 0 sent "
              f"in the last step: { {c: v['sent'] for c, v in moved.items() if v['sent']} }")


if __name__ == "__main__":
    main()
    tessel.shutdown()  # the groups go once main's model is gone
