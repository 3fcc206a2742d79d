"""The probe's 4 KiB ring step in a process holding only the world's group, then the probe as it now runs (with a
data-parallel job's mesh built and held: tessel.planner.probe.hold_job_mesh), in one invocation. Rank 0 prints one
JSON line: ``without_mesh`` (seconds a ring step, the slowest rank's mean over 40 back-to-back calls, as the probe
times ``latency``), the OS threads of the process before and after, and the probe's own line.

Run: tessel cluster run --hosts 8 --rate 1gbit --cpus 0.25 --torchrun -- bench/plan-probe-groups/groups.py"""
import json
import os
import statistics

import torch
import torch.distributed as dist

from tessel import comm, mesh
from tessel.planner import probe


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    n = dist.get_world_size()
    small, a, w = torch.zeros(probe.SMALL // 4), torch.randn(64, 512), torch.randn(512, 512)
    probe.loaded(small, a, w, 3, 0)  # (gloo's first calls at a new size set up its buffers)
    mine = statistics.mean(probe.loaded(small, a, w, 40, 0)) / (2 * (n - 1))
    without = max(comm.all_gather_object(mine, "probe"))
    threads = len(os.listdir("/proc/self/task"))
    out = probe.measure()
    if dist.get_rank() == 0:
        print(json.dumps({"hosts": n, "without_mesh": without, "threads_without": threads,
                          "threads_with": len(os.listdir("/proc/self/task")), **out}), flush=True)
    mesh.shutdown()


if __name__ == "__main__":
    main()
