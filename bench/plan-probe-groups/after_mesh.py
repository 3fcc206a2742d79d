"""A call's wall after a burst of compute, with a data-parallel job's mesh held (as the probe now times): a 4 KiB
all-reduce in groups of 2, 4 and the world (consecutive ranks, as tensor-parallel groups are), and a pipeline's send
and receive between neighbours, each after 0, 1, 4 and 16 matmuls of 64x512 by 512x512 (the probe's burst), 20 calls.
Rank 0 prints, per call and burst: the burst's CPU (median over ranks), the call's wall from the end of the rank's own
burst (median over ranks of each rank's median, and of each rank's mean).

Run: tessel cluster run --hosts 8 --rate 1gbit --cpus 0.25 --torchrun -- bench/plan-probe-groups/after_mesh.py"""
import statistics
import time

import torch
import torch.distributed as dist

from tessel import comm, mesh
from tessel.planner import probe

BURSTS = (0, 1, 4, 16)


def pair(t: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    works = comm.batch_isend_irecv([("send", t, (rank + 1) % n), ("recv", torch.empty_like(t), (rank - 1) % n)],
                                   "probe")
    for w in works:
        w.wait()


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    probe.hold_job_mesh()
    n, rank = dist.get_world_size(), dist.get_rank()
    a, w, t = torch.randn(64, 512), torch.randn(512, 512), torch.zeros(1024)
    calls = {}
    for size in sorted({s for s in (2, 4) if s < n} | {n}):
        group, _ = dist.new_subgroups_by_enumeration([list(range(s, min(s + size, n))) for s in range(0, n, size)])
        calls[f"all-reduce, group of {size}"] = lambda g=group: comm.all_reduce(t, "probe", group=g)
    calls["send and receive, neighbours"] = lambda: pair(t)
    rows = []
    for name, call in calls.items():
        for _ in range(3):
            call()
        for burst in BURSTS:
            comm.barrier("probe")
            walls, cpus = [], []
            for _ in range(20):
                c0 = time.thread_time()
                probe.compute_burst(a, w, burst)
                cpus.append(time.thread_time() - c0)
                t0 = time.perf_counter()
                call()
                walls.append(time.perf_counter() - t0)
            rows.append((name, burst, statistics.median(cpus), statistics.median(walls), statistics.mean(walls)))
    got = comm.all_gather_object(rows, "probe")
    if rank == 0:
        for i, (name, burst, *_) in enumerate(rows):
            cpu, med, mean = (statistics.median(r[i][k] for r in got) for k in (2, 3, 4))
            print(f"{name}, after {burst} matmuls ({cpu * 1e3:.2f} ms CPU): call {med * 1e3:.2f} ms median, "
                  f"{mean * 1e3:.2f} mean", flush=True)
    mesh.shutdown()


if __name__ == "__main__":
    main()
