"""A rank's compute speed (its CPU seconds over wall seconds in bursts of matmuls, as tessel.planner.probe times
it) two ways on the emulated hosts: every rank computing at once (the probe's way, 40 bursts), and each rank alone
in turn while the others wait at a barrier (40 bursts each). Rank 0 prints every rank's pair.

    tessel cluster run --hosts 3 --rate 1gbit --cpus 0.6667 --torchrun -- bench/lstm-3h/speeds.py"""
import json
import time

import torch
import torch.distributed as dist

from tessel.planner.probe import compute_burst


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    me, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for way, turns in (("all at once", 1), ("alone", n)):
        wall = cpu = 0.0
        for turn in range(turns):
            dist.barrier()
            if way == "all at once" or turn == me:
                for _ in range(40):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    compute_burst(a, w, 6)
                    wall, cpu = wall + time.perf_counter() - t0, cpu + time.thread_time() - c0
        out[way] = round(cpu / wall, 3)
    got = [None] * n
    dist.all_gather_object(got, out)
    if me == 0:
        print("speeds " + json.dumps(got), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
