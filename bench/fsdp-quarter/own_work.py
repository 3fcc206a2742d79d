"""FSDP2's own CPU work a step, with no bytes to move: the plan check's LSTM on a gloo world of one process, one
thread, a step (forward, backward, SGD) timed on the main thread's CPU clock plain and with tessel.fsdp's units
(fully_shard per chain layer, then the root, tessel.comm's gather and scatter) at two micro-batch sizes; the median
of 25 steps after 5. What is left of FSDP's cost on a real shard group (bench/fsdp-quarter/README.md) is its calls.

    python bench/fsdp-quarter/own_work.py"""
import os
import statistics
import time

import torch
import torch.distributed as dist


def step_cpu(job, fsdp_units: bool, samples: int, steps: int = 30) -> float:
    from torch.distributed.device_mesh import init_device_mesh

    from tessel import fsdp
    from tessel.chain import chain_of
    torch.manual_seed(0)
    model = job.build()
    if fsdp_units:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        fsdp.apply_fsdp(model, mesh["dp"], fsdp.units(model, [layer.owns for layer in chain_of(model).layers]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randint(0, 4096, (samples, 32)), torch.randint(0, 4096, (samples, 32))
    took = []
    for _ in range(steps):
        t0 = time.thread_time()
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
        took.append(time.thread_time() - t0)
    return statistics.median(took[5:])


def main() -> None:
    import warnings

    from tessel.bench import plan_check as pc
    from tessel.config import load_config
    from tessel.resolve import job_of
    warnings.filterwarnings("ignore")  # (FSDP2 warns that the LSTM unit returns a view; nothing changes it in place)
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("gloo", rank=0, world_size=1)
    job = job_of(load_config(None, [*pc.MODELS["lstm_lm"], *pc.COMMON]))
    for samples in (4, 16):  # a dp8 rank's share of the global batch of 32, and a dp2 rank's
        plain, sharded = step_cpu(job, False, samples), step_cpu(job, True, samples)
        print(f"{samples} samples: plain {plain * 1e3:.1f} ms, FSDP2 units {sharded * 1e3:.1f} ms, "
              f"+{(sharded - plain) * 1e3:.1f} ms a step")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
