"""Your own loop with sparse tables taken out of an unmodified model: split over the ranks with 2-D
scheduling (alltoall, the default here), on row shards (ps), all-gathered, or chosen by the cost model.

    torchrun --standalone --nproc-per-node 2 examples/sparse_loop.py            # alltoall
    torchrun --standalone --nproc-per-node 2 examples/sparse_loop.py ps         # or allgather, auto
"""

import sys

import torch

from tessel import ParallelDims, apply_ddp, build_mesh, comm, init_distributed, shutdown, sparse
from tessel.models import LSTMLM


def main(strategy: str = "alltoall") -> None:
    init_distributed()
    dims = ParallelDims.resolve(torch.distributed.get_world_size())
    mesh = build_mesh(dims)
    rank = mesh.get_local_rank("dp")

    torch.manual_seed(0)  # same initial weights on every rank
    model = LSTMLM(vocab_size=20000, dim=64, hidden=128, softmax="sampled", num_sampled=128)
    g = torch.Generator().manual_seed(rank)  # each rank its own data
    batches = [torch.randint(0, 20000, (8, 33), generator=g) for _ in range(12)]
    split = [(b[:, :-1], b[:, 1:]) for b in batches]

    # Take the tables out (embedding, sampled-softmax weights and bias) and split them; DDP gets the rest.
    tables = sparse.shard(model, split[:2], strategy=strategy, optimizer="adagrad", lr=0.1, group=mesh.get_group("dp"))
    model = apply_ddp(model, mesh.get_group("dp"))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    if rank == 0:
        print(tables.describe())

    for i, (x, y) in enumerate(split):
        tables.begin_step(x, split[i + 1][0] if i + 1 < len(split) else None)  # the next batch's rows come early
        loss = model(x, y)
        tables.final_backward(True)  # one micro-batch: this backward completes the step's gradients
        loss.backward()
        tables.reduce()  # row gradients to their owners (already in flight under alltoall)
        tables.step()  # owners update their rows, then send the next step's late rows
        opt.step()
        opt.zero_grad()
        step = comm.counter.end_step()
    if rank == 0:
        moved = {c: v["sent"] for c, v in step.items()}
        print(f"loss {loss.item():.3f}; bytes sent per step: {moved}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
    shutdown()  # after main(): its DDP model is gone, so no group outlives the world
