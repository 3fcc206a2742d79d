"""What the probe's new measurement costs: the wall seconds of tessel.planner.probe.measure as `--plan auto` and
`tessel bench plan` run it, and of its wait_after alone, on rank 0 (every rank runs both).

Run: tessel cluster run --hosts 8 --rate 1gbit --cpus 0.25 --torchrun -- bench/plan-wait/cost.py"""
import json
import time

import torch
import torch.distributed as dist

from tessel import mesh
from tessel.planner import probe


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    probe.measure()
    whole = time.perf_counter() - t0
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    t0 = time.perf_counter()
    probe.wait_after(a, w)
    wait = time.perf_counter() - t0
    if dist.get_rank() == 0:
        print(json.dumps({"hosts": dist.get_world_size(), "probe_s": whole, "wait_after_s": wait}), flush=True)
    mesh.shutdown()


if __name__ == "__main__":
    main()
