"""Your own training loop with tessel's data parallelism: a plain model, wrapped from outside.

    torchrun --standalone --nproc-per-node 2 examples/own_loop.py
"""

import torch

from tessel import ParallelDims, apply_ddp, build_mesh, comm, init_distributed, shutdown


def main() -> None:
    init_distributed()  # gloo on CPU, nccl with CUDA; collectives time out after 30 s
    dims = ParallelDims.resolve(torch.distributed.get_world_size())  # dp = world size
    mesh = build_mesh(dims)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = apply_ddp(model, mesh.get_group("dp"))  # DDP on mesh["dp"]; its traffic is counted
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    rank = mesh.get_local_rank("dp")
    g = torch.Generator().manual_seed(rank)  # each rank its own shard of data
    for _ in range(20):
        x = torch.randn(16, 32, generator=g)
        loss = (model(x).squeeze(1) - x.sum(1)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sent = comm.counter.end_step()["dp.dense"]["sent"]
    if rank == 0:
        print(f"loss {loss.item():.3f}, dp.dense sent per step {sent} bytes")


if __name__ == "__main__":
    main()
    shutdown()  # after main(): its DDP model is gone, so no group outlives the world (tessel.shutdown says why)
