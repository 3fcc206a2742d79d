"""Where a dp8 step's CPU goes on quarter-core hosts: the plan check's Transformer (4 layers, dim 128, vocab 4096,
seq 32, 4 samples a rank: a global batch of 32 over 8), SGD, timed three ways in one invocation, each phase's
per-step wall and process CPU (all threads, gloo's included) as medians over steps 3-12, then over ranks:

  alone    rank 0 trains its local batch while the other ranks wait in a barrier (one host busy)
  together every rank trains its local batch, no collective in the timed part (8 hosts busy; a barrier before
           each step, untimed, so the ranks' steps line up and the slowest rank's wall can be read per step)
  ddp      every rank trains under torch's DDP (tessel's 1 MB buckets: 5 all-reduces a step)
  buckets  the all-reduces alone: DDP's 5 buckets' sizes (2.0, 1.01, 1.01, 1.01, 2.02 MB), no compute

Run: tessel cluster run --hosts 8 --rate 1gbit --torchrun -- bench/plan-ddp-8h-1g/step_cpu.py"""
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tessel.models import build_model

STEPS, SKIP = 12, 2


def model():
    torch.manual_seed(0)
    return build_model("transformer_lm", vocab_size=4096, seq_len=32, dim=128, hidden=0, layers=4, heads=4,
                       dropout=0.0, tie_embeddings=False, softmax="full", num_sampled=0, in_features=0, classes=0)


def steps(net, n=STEPS, sync=False):
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    walls, cpus = [], []
    for _ in range(n):
        x = torch.randint(0, 4096, (4, 32), generator=g)
        if sync:  # (untimed) every rank starts the step together, as after a step's all-reduce
            dist.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        net(x, x).backward()
        opt.step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return [statistics.median(walls[SKIP:]), statistics.median(cpus[SKIP:])], walls[SKIP:]


def buckets(n=STEPS):  # (medians only)
    ts = [torch.zeros(int(mb * 1e6) // 4) for mb in (2.0, 1.01, 1.01, 1.01, 2.02)]
    walls, cpus = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        for t in ts:
            dist.all_reduce(t)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return [statistics.median(walls[SKIP:]), statistics.median(cpus[SKIP:])]


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    out = []
    dist.barrier()
    out += steps(model())[0] if rank == 0 else [0.0, 0.0]
    dist.barrier()
    medians, walls = steps(model(), sync=True)
    out += medians
    dist.barrier()
    out += steps(DistributedDataParallel(model(), bucket_cap_mb=1.0))[0]
    dist.barrier()
    out += buckets()
    dist.barrier()
    mine = torch.tensor(out + walls, dtype=torch.float64)
    got = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(got, mine)
    if rank == 0:
        st = torch.stack(got) * 1e3
        print(f"alone (rank 0): wall {st[0, 0]:.1f} ms, CPU {st[0, 1]:.1f} ms a step")
        for name, c in (("together", 2), ("ddp", 4), ("buckets", 6)):
            w, cpu = st[:, c].median().item(), st[:, c + 1].median().item()
            print(f"{name} (median over ranks; range of CPU {st[:, c + 1].min():.1f}-{st[:, c + 1].max():.1f}): "
                  f"wall {w:.1f} ms, CPU {cpu:.1f} ms a step")
        per_step = st[:, 8:]  # (ranks, steps): each rank's wall of each step, together
        print(f"together, the slowest rank's wall a step (median over steps): {per_step.max(0).values.median():.1f} "
              f"ms; the median rank's: {per_step.median(0).values.median():.1f} ms")
    dist.destroy_process_group()


main()
