"""The rate a rank moves FSDP's two collectives at against the all-reduce the planner prices them by: an 8 MB
all-reduce, tessel.comm's all-gather into a tensor (FSDP2's gather here) and its reduce-scatter (an all-to-all and a
local sum on gloo), each over the world after a compute burst, with a data-parallel job's mesh held as the probe
holds it. Rank 0 prints the slowest rank's Mbit/s of each (bytes a rank sends: 2(n-1)/n of the all-reduce's tensor,
(n-1)/n of the gathered one's), median of 6. FSDP_RATES_GROUP=g times them in groups of g consecutive ranks (all
at once, as FSDP's shard groups of a pipeline's stages run) and FSDP_RATES_MB=m at m MB a call.

Run: tessel cluster run --hosts 6 --rate 200mbit --cpus 0.3333 --torchrun -- bench/plan-wait/fsdp_rates.py"""
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from tessel import comm, mesh
from tessel.planner import probe

BYTES = int(float(os.environ.get("FSDP_RATES_MB", "8")) * (1 << 20))


def timed(call, a, w, rounds=6):
    call()
    out = []
    for _ in range(rounds):
        probe.compute_burst(a, w, 6)
        comm.barrier("probe")
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    probe.hold_job_mesh()
    world = dist.get_world_size()
    n = int(os.environ.get("FSDP_RATES_GROUP", world))
    group, _ = dist.new_subgroups_by_enumeration([list(range(s, s + n)) for s in range(0, world, n)])
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    whole, part = torch.zeros(BYTES // 4 // n * n), torch.zeros(BYTES // 4 // n)
    seconds = {"all-reduce": timed(lambda: comm.all_reduce(whole, "probe", group=group), a, w),
               "all-gather": timed(lambda: comm.all_gather_into(whole, part, "probe", group=group), a, w),
               "reduce-scatter": timed(lambda: comm.reduce_scatter(part, whole, "probe", group=group), a, w)}
    sent = {"all-reduce": 2 * (n - 1) / n * whole.numel() * 4, "all-gather": (n - 1) / n * whole.numel() * 4,
            "reduce-scatter": (n - 1) / n * whole.numel() * 4}
    mbit = {k: sent[k] * 8 / 1e6 / s for k, s in seconds.items()}
    got = comm.all_gather_object(mbit, "probe")
    if dist.get_rank() == 0:
        print(json.dumps({"hosts": world, "group": n, "mb": BYTES / (1 << 20),
                          **{k: round(min(g[k] for g in got), 1) for k in mbit}}), flush=True)
    mesh.shutdown()


if __name__ == "__main__":
    main()
