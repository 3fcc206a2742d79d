"""Exact byte counts and values of every collective in tessel.comm, on real gloo worlds."""

import time

import pytest
import torch
import torch.distributed as dist

from tessel import comm
from tessel.errors import CommError, PlanError
from tessel.mesh import ParallelDims, build_mesh


def check_collectives():
    r, p = dist.get_rank(), dist.get_world_size()
    c = comm.counter
    f32 = 4

    x = torch.full((6, 4), float(r + 1))
    comm.all_reduce(x, "a")
    assert torch.all(x == p * (p + 1) / 2)
    assert c.step()["a"] == {"sent": 2 * (p - 1) * 24 * f32 // p, "recv": 2 * (p - 1) * 24 * f32 // p}

    out = torch.empty(p * 3, 2)
    comm.all_gather_into(out, torch.full((3, 2), float(r)), "g")
    assert torch.equal(out[:, 0], torch.arange(p).repeat_interleave(3).float())
    assert c.step()["g"] == {"sent": (p - 1) * 6 * f32, "recv": (p - 1) * 6 * f32}
    parts = comm.all_gather(torch.tensor(float(r)), "g2")
    assert [float(t) for t in parts] == [float(i) for i in range(p)]

    inp = torch.arange(p * 5, dtype=torch.float64).reshape(p * 5, 1) * (r + 1)
    res = torch.empty(5, 1, dtype=torch.float64)
    comm.reduce_scatter(res, inp, "rs")
    expect = torch.arange(p * 5, dtype=torch.float64).reshape(p * 5, 1)[r * 5:(r + 1) * 5] * p * (p + 1) / 2
    assert torch.equal(res, expect)
    assert c.step()["rs"] == {"sent": (p - 1) * 5 * 8, "recv": (p - 1) * 5 * 8}

    # uneven all_to_all: rank r sends j+1 rows of width 3 to rank j (bf16: 2 bytes)
    ins = [j + 1 for j in range(p)]
    outs = [r + 1] * p
    t = torch.full((sum(ins), 3), float(r), dtype=torch.bfloat16)
    o = torch.empty(sum(outs), 3, dtype=torch.bfloat16)
    comm.all_to_all(o, t, "x", output_splits=outs, input_splits=ins)
    assert torch.equal(o[:, 0].float(), torch.arange(p).repeat_interleave(r + 1).float())
    assert c.step()["x"] == {"sent": (sum(ins) - ins[r]) * 3 * 2, "recv": (sum(outs) - outs[r]) * 3 * 2}

    b = torch.full((7,), float(r))
    comm.broadcast(b, 1, "b")
    assert torch.all(b == 1)
    pos = (r - 1) % p
    assert c.step()["b"] == {"sent": 28 if pos < p - 1 else 0, "recv": 28 if pos > 0 else 0}

    # ring of send/recv, blocking and batched
    nxt, prv = (r + 1) % p, (r - 1) % p
    got = torch.empty(10, dtype=torch.int64)
    works = comm.batch_isend_irecv([("send", torch.full((10,), r), nxt), ("recv", got, prv)], "pp.act")
    for w in works:
        w.wait()
    assert torch.all(got == prv)
    assert c.step()["pp.act"] == {"sent": 80, "recv": 80}
    if r == 0:
        comm.send(torch.ones(3), 1, "p2p")
    elif r == 1:
        buf = torch.zeros(3)
        comm.recv(buf, 0, "p2p")
        assert torch.all(buf == 1)

    w = comm.all_reduce(torch.ones(8), "async", async_op=True)
    w.wait()
    step = c.end_step()
    assert c.step() == {} and c.total()["a"] == step["a"]
    return step


@pytest.mark.parametrize("size", [2, 4])
def test_collectives_bytes_and_values(size, world2, world4):
    world = {2: world2, 4: world4}[size]
    steps = world.run(check_collectives)
    assert len(steps) == size


def check_ddp_hook_bytes():
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    n_bytes = sum(q.numel() for q in model.parameters()) * 4
    for q in model.parameters():
        comm.broadcast(q.data, 0, "dp.init")
    ddp = DDP(model, init_sync=False, forward_sync_buffers=False)
    ddp.register_comm_hook(None, comm.ddp_comm_hook("dp.dense"))
    comm.counter.end_step()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    ddp(x).square().mean().backward()
    step = comm.counter.end_step()
    # one bucket for this small model: exactly the ring all_reduce of all gradient bytes
    assert step == {"dp.dense": {"sent": 2 * (p - 1) * n_bytes // p, "recv": 2 * (p - 1) * n_bytes // p}}
    # gradients really are averaged over ranks
    g = [q.grad.clone() for q in model.parameters()]
    ref = [q.clone() for q in g]
    for t in ref:
        dist.all_reduce(t)
    for a, b in zip(g, ref):
        torch.testing.assert_close(a, b / p, rtol=0, atol=0)
    return n_bytes


def test_ddp_traffic_is_counted(world2, world4):
    assert world2.run(check_ddp_hook_bytes)[0] == world4.run(check_ddp_hook_bytes)[0] == (16 * 32 + 32 + 32 * 8 + 8) * 4


class Terms(torch.nn.Module):
    """Parameters whose gradients are chosen tensors: d/dw of sum(w * c) is c."""

    def __init__(self, sizes):
        super().__init__()
        self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n)) for n in sizes)

    def forward(self, cs):
        return sum((w * c).sum() for w, c in zip(self.w, cs))


def check_ddp_half_sum():
    """bf16 gradient buckets summed in fp32 and rounded once, over several buckets and two backwards."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    p, r = dist.get_world_size(), dist.get_rank()
    sizes = [4096, 4096, 2048, 64]  # divisible by 4: every rank sums an equal slice of every bucket
    model = Terms(sizes)
    ddp = DDP(model, init_sync=False, forward_sync_buffers=False, bucket_cap_mb=0.01, gradient_as_bucket_view=True)
    hook, buckets = comm.ddp_comm_hook("dp.dense", torch.bfloat16), []

    def counted(state, bucket):  # DDP reads the parameter names
        buckets.append(bucket.index())
        return hook(state, bucket)

    ddp.register_comm_hook(None, counted)
    # element e: 1 on rank e % p, 2^-8 elsewhere (times p: the hook divides by p first, exactly). Summed in fp32
    # and rounded once: 1 + (p-1) 2^-8; a bf16 sum that adds 2^-8 to 1 first rounds it away (ties to even)
    cs = [torch.where(torch.arange(n) % p == r, 1.0, 2.0 ** -8) * p for n in sizes]
    for _ in range(2):
        comm.counter.end_step()
        buckets.clear()
        ddp(cs).backward()
        step = comm.counter.end_step()
        moved = 2 * (p - 1) * sum(sizes) * 2 // p  # a ring's bytes at 2 bytes an element
        assert step == {"dp.dense": {"sent": moved, "recv": moved}}, step
        exact = torch.tensor(1 + (p - 1) * 2.0 ** -8).to(torch.bfloat16).float()
        for w in model.w:
            assert torch.equal(w.grad, exact.expand_as(w.grad)), (w.grad.unique(), exact)
        for w in model.w:
            w.grad = None
    return buckets


def test_ddp_bf16_hook_sums_in_fp32_and_rounds_once(world2, world4):
    assert len(world4.run(check_ddp_half_sum)[0]) > 1  # several buckets: each finished by the next one's hook
    assert len(world2.run(check_ddp_half_sum)[0]) > 1


def check_mesh():
    dims = ParallelDims(dp=2, pp=1, tp=2, world_size=4)
    mesh = build_mesh(dims, timeout=10)
    r = dist.get_rank()
    assert mesh.mesh_dim_names == ("pp", "dp", "tp")
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    # tp groups are neighbouring ranks (innermost dim); dp strides over them
    assert dist.get_process_group_ranks(tp) == [r - r % 2, r - r % 2 + 1]
    assert dist.get_process_group_ranks(dp) == [r % 2, r % 2 + 2]
    x = torch.tensor([float(r)])
    comm.all_reduce(x, "tp", group=tp)
    assert float(x) == (r - r % 2) * 2 + 1
    return True


def test_mesh_groups(world4):
    assert all(world4.run(check_mesh))


def check_timeout():
    dims = ParallelDims(dp=2, pp=1, tp=1, world_size=2)
    mesh = build_mesh(dims, timeout=2)
    if dist.get_rank() == 1:
        time.sleep(4)  # a stuck peer: never joins the all_reduce (twice the timeout)
        return None
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(4), "dp.dense", group=mesh.get_group("dp"))
    except CommError as e:
        return (time.monotonic() - t0, str(e))
    return None


def test_stuck_peer_gives_comm_error_not_hang(world2):
    res = world2.run(check_timeout)
    world2.broken = True  # the timed-out group may hold a half-finished op; start afresh next time
    elapsed, msg = res[0]
    assert elapsed < 10
    assert "rank 0" in msg and "all_reduce" in msg and "dp.dense" in msg and "timed out" in msg


def check_patience():
    dims = ParallelDims(dp=2, pp=1, tp=1, world_size=2)
    group = build_mesh(dims, timeout=2).get_group("dp")
    if dist.get_rank() == 0:
        time.sleep(4)  # long work of one rank (the planner's profile): twice the group's timeout
    with comm.patience(30, group):
        got = comm.all_gather_object(dist.get_rank(), "meta", group)
    after = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    with comm.patience(1, group):  # shorter than the group's own: left as it is
        kept = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    return got, after, kept


def test_patience_lets_a_collective_wait_out_one_ranks_long_work(world2):
    """The wait for rank 0's plan outlasts the group's collective timeout, which is its own again afterwards."""
    res = world2.run(check_patience)
    assert res[0] == res[1] == ([0, 1], 2.0, 2.0)


def test_parallel_dims_errors():
    with pytest.raises(PlanError, match=r"dp=2 x pp=1 x tp=1 = 2 do not match the world size 3"):
        ParallelDims(dp=2, pp=1, tp=1, world_size=3)
    with pytest.raises(PlanError, match="not divisible by pp=2"):
        ParallelDims.resolve(3, pp=2)
    assert ParallelDims.resolve(8, pp=2, tp=2).dp == 2
    with pytest.raises(PlanError, match="integers >= 1"):
        ParallelDims(dp=0, pp=1, tp=1, world_size=0)


def test_guard_tells_a_peers_failure_from_this_ranks_own_error():
    """A guarded block also computes (a pipeline step): an error of its own is named with its place, not blamed on
    a peer; what a backend says when the other end went away still reads as a peer's failure."""
    with pytest.raises(CommError, match=r"failed on this rank at test_comm\.py:\d+ \(indices"):
        with comm.guard("pipeline step", "pp"):
            raise RuntimeError("indices should be on the same device")
    with pytest.raises(CommError, match="a peer rank failed or left"):
        with comm.guard("irecv", "pp"):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:547] Connection closed by peer")
    with pytest.raises(CommError, match="timed out: a peer rank is dead or stuck"):
        with comm.guard("all_reduce", "dp.dense"):
            raise RuntimeError("Wait timeout after 5000 ms")


def test_dry_group_gives_shapes_and_moves_nothing():
    """A Dry group (the planner's stand-in for a grid axis) needs no process group: each collective gives the
    shape a real one would, from this rank's data, and counts no byte."""
    comm.counter.reset()
    g = comm.Dry(4)
    x = torch.arange(6.0).reshape(2, 3)
    out = torch.empty(8, 3)
    comm.all_gather_into(out, x, "tp", group=g)
    assert torch.equal(out, x.repeat(4, 1))
    part = torch.empty(2, 3)
    comm.reduce_scatter(part, out, "tp", group=g)
    assert torch.equal(part, 4 * x)  # four copies of this rank's block summed
    y = x.clone()
    work = comm.all_reduce(y, "tp", group=g, async_op=True)
    work.wait()
    assert torch.equal(y, x) and comm.group_size(g) == 4 and comm.counter.total() == {}
