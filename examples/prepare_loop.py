"""A plain PyTorch model and loop, distributed by ``tessel.prepare`` (the three marked lines).

A click model tessel has never seen: a user-id table, a bag of the items the user viewed, an MLP. The
tables are served by rows (``auto`` decides per table; or name a strategy), the MLP by DDP.

    torchrun --standalone --nproc-per-node 2 examples/prepare_loop.py           # plan auto
    torchrun --standalone --nproc-per-node 2 examples/prepare_loop.py ps        # or alltoall, allgather, dense
    python examples/prepare_loop.py                                             # one process: runs unchanged
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn

import tessel
from tessel import comm

USERS, ITEMS, DIM, BATCH, STEPS = 20000, 50000, 16, 64, 40


class ClickModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(USERS, DIM)
        self.items = nn.EmbeddingBag(ITEMS, DIM, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, users, viewed, clicked):  # (B,), (B, 8), (B,)
        h = torch.cat([self.users(users), self.items(viewed)], 1)  # (B, 2*DIM)
        return F.binary_cross_entropy_with_logits(self.mlp(h).squeeze(1), clicked)


def batches():
    """The same global batches on every rank: users click when they viewed many low-numbered items."""
    g = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        users = torch.randint(0, USERS, (BATCH,), generator=g)
        viewed = (torch.rand(BATCH, 8, generator=g) ** 2 * ITEMS).long()  # popular items are low ids
        clicked = ((viewed < ITEMS // 10).float().mean(1) > 0.45).double()
        yield users, viewed, clicked


class Batches:  # a re-iterable loader (a torch DataLoader works the same)
    def __iter__(self):
        return batches()


def main() -> None:
    torch.manual_seed(0)
    model = ClickModel().double()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    plan = sys.argv[1] if len(sys.argv) > 1 else "auto"
    model, optimizer, loader = tessel.prepare(model, optimizer, Batches(), plan=plan)  # <- the one new line
    first = None
    for users, viewed, clicked in loader:
        loss = model(users, viewed, clicked)
        loss.backward()
        tessel.clip_grad_norm_(model, 1.0)  # <- instead of torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        first = loss.item() if first is None else first
        moved = comm.counter.end_step()
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(f"rank 0's loss {first:.3f} -> {loss.item():.3f}; bytes sent per step: "
              f"{ {c: v['sent'] for c, v in moved.items() if v['sent']} }")


main()
tessel.shutdown()  # the groups go once main's model is gone (alone: returns at once)
