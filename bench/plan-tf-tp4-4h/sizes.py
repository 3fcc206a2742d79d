"""How often an all-reduce over the world stalls, by size: 60 calls of each size back to back after a barrier, rank 0's
median, mean and longest call and how many took over 30 ms; then every host's and the switch's qdisc counters (drops)
and each host's TCP retransmits, read from the network namespaces.

Run (the three settings of docs/benchmarks.md):
    tessel cluster run --hosts 4 --rate 1gbit --cpus 0.5 --torchrun -- bench/plan-tf-tp4-4h/sizes.py
    tessel cluster run --hosts 4 --rate 1gbit --cpus 2 --torchrun -- bench/plan-tf-tp4-4h/sizes.py
    tessel cluster run --hosts 4 --rate 10gbit --cpus 0.5 --torchrun -- bench/plan-tf-tp4-4h/sizes.py"""
import statistics
import subprocess
import time

import torch
import torch.distributed as dist

KIB = (448, 480, 512, 544, 576, 512, 1024, 2048)  # 512 KiB is the Transformer's 1-D tp call on this cell


def retransmits() -> int:
    head, vals = [ln.split() for ln in open("/proc/net/snmp") if ln.startswith("Tcp:")]
    return int(dict(zip(head, vals))["RetransSegs"])


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    before = retransmits()
    for kib in KIB:
        t = torch.zeros(kib * 256)
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        w = []
        for _ in range(60):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            w.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"{kib} KiB: median {statistics.median(w) * 1e3:.1f} ms, mean {statistics.mean(w) * 1e3:.1f}, "
                  f"longest {max(w) * 1e3:.1f}; over 30 ms: {sum(x > 0.03 for x in w)} of 60", flush=True)
    moved = [None] * dist.get_world_size()
    dist.all_gather_object(moved, retransmits() - before)
    if rank == 0:
        print(f"TCP segments retransmitted, per host: {moved}")
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for ns in sorted(n for n in names if n.startswith("tsl-")):
            out = subprocess.run(["tc", "-s", "-n", ns, "qdisc"], capture_output=True, text=True).stdout
            drops = [ln.strip() for ln in out.splitlines() if "dropped" in ln and "Sent 0 " not in ln]
            print(f"{ns} tbf: {'; '.join(drops)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
