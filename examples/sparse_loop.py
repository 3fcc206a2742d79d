"""Your own loop with sparse tables on parameter-server shards (Parallax's hybrid): an unmodified model.

    torchrun --standalone --nproc-per-node 2 examples/sparse_loop.py
"""

import torch

from tessel import ParallelDims, build_mesh, comm, init_distributed, parallelize, sparse
from tessel.models import LSTMLM

init_distributed()
dims = ParallelDims.resolve(torch.distributed.get_world_size())
mesh = build_mesh(dims)
rank = mesh.get_local_rank("dp")

torch.manual_seed(0)  # same initial weights on every rank
model = LSTMLM(vocab_size=20000, dim=64, hidden=128, softmax="sampled", num_sampled=128)
g = torch.Generator().manual_seed(rank)  # each rank its own data
batches = [torch.randint(0, 20000, (8, 33), generator=g) for _ in range(12)]
split = [(b[:, :-1], b[:, 1:]) for b in batches]

# Take the tables out (embedding, sampled-softmax weights and bias) and shard their rows; DDP gets the rest.
tables = sparse.shard(model, split[:2], strategy="ps", optimizer="adagrad", lr=0.1, group=mesh.get_group("dp"))
model = parallelize(model, dims, mesh)
opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
if rank == 0:
    print(tables.describe())

for x, y in split:
    loss = model(x, y)
    loss.backward()
    tables.reduce()  # row gradients to their owners
    tables.step()  # owners update their rows
    opt.step()
    opt.zero_grad()
    step = comm.counter.end_step()
if rank == 0:
    moved = {c: v["sent"] for c, v in step.items()}
    print(f"loss {loss.item():.3f}; bytes sent per step: {moved}")
torch.distributed.destroy_process_group()
