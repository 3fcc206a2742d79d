"""reduce-scatter on the emulated hosts: tessel.comm's (all-to-all + local sum), a ring over point-to-point
messages, gloo's own reduce_scatter_tensor (if it has one), beside the all-reduce; per round, alternating order,
after the probe's compute burst. Prints per round rank 0's ms for each."""
import statistics, sys, time
import torch
import torch.distributed as dist
from tessel import comm
from tessel.planner.probe import compute_burst


def ring_rs(output, tensor, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    nxt, prv = dist.get_global_rank(group, (r + 1) % p) if group else (r + 1) % p, \
        dist.get_global_rank(group, (r - 1) % p) if group else (r - 1) % p
    chunks = tensor.view(p, -1)
    acc = chunks[(r - 1) % p].clone()
    buf = torch.empty_like(acc)
    for s in range(p - 1):
        sw = dist.isend(acc, nxt, group=group)
        rw = dist.irecv(buf, prv, group=group)
        rw.wait(); sw.wait()
        acc = buf + chunks[(r - s - 2) % p]
        buf = torch.empty_like(acc) if s < p - 2 else buf
    output.view(-1).copy_(acc)


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    p, rank = dist.get_world_size(), dist.get_rank()
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    # correctness: each rank's slice equals the sum
    x = torch.randn(p * 1000, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    o1, o2 = torch.empty(1000, dtype=torch.float64), torch.empty(1000, dtype=torch.float64)
    comm.reduce_scatter(o1, x, "x"); ring_rs(o2, x)
    assert torch.allclose(o1, o2, rtol=0, atol=1e-12), (o1 - o2).abs().max()
    native = True
    try:
        o3 = torch.empty(1000, dtype=torch.float64); dist.reduce_scatter_tensor(o3, x)
        assert torch.allclose(o1, o3, atol=1e-12)
    except Exception as e:  # noqa
        native = False
        if rank == 0:
            print("native reduce_scatter_tensor:", repr(e)[:200], flush=True)
    res = {}
    for nbytes in (1 << 20, 4 << 20):
        n = nbytes // 4
        t, part = torch.randn(n), torch.zeros(n // p)
        ops = {"all_reduce": lambda: dist.all_reduce(t),
               "a2a_rs": lambda: comm.reduce_scatter(part, t, "x"),
               "ring_rs": lambda: ring_rs(part, t)}
        if native:
            ops["native_rs"] = lambda: dist.reduce_scatter_tensor(part, t)
        for f in ops.values():
            f(); f()
        names = list(ops)
        for rd in range(rounds):
            order = names if rd % 2 == 0 else names[::-1]
            for name in order:
                ts = []
                for _ in range(3):
                    compute_burst(a, w, 6)
                    dist.barrier()
                    t0 = time.perf_counter(); ops[name](); ts.append(time.perf_counter() - t0)
                res.setdefault((nbytes, name), []).append(statistics.median(ts))
    if rank == 0:
        for (nb, name), v in res.items():
            print(f"{nb >> 10}K {name} ms_per_round {[round(x * 1e3, 2) for x in v]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
