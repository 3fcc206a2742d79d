"""Long runs stay flat: after warm-up a training step leaves nothing behind, on every served-table path.

Counts live tensors (every tensor the garbage collector tracks, and the bytes of their distinct storages)
at three points of a run, not seconds or the resident set: a step that keeps one tensor for good adds one
per step, tens between two samples here, while a run that keeps nothing has the same count at every step
boundary, give or take a prefetch in flight (``TRANSIENT``). The ``alltoall`` tables' gradient hooks once held
every step's rows and buffers through a cycle the garbage collector cannot see (hooks live in C++): 6 tensors,
~1 MB a step on the default model.
"""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tessel
from composed import planned
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.mesh import build_mesh
from tessel.parallelize import parallelize
from tessel.train.build import build, build_data

STEPS, EVERY = 46, 15  # samples after steps 15, 30 and 45, past the first (warm-up) steps: a tensor kept every
# 5 steps adds 3 between two samples, over TRANSIENT
B, T, D = 8, 8, 16  # global batch, sequence length, model width
# What may differ between two step boundaries of a run that keeps nothing: the rows an alltoall table
# prefetches for the next batch, whose unique count changes from batch to batch. At most every one of the
# B*T ids is unique: its rows (fp32) in the leaf, the two priority phases' receive buffers and the send buffer.
SLACK = 4 * B * T * D * 4


def live_tensors() -> tuple[int, int]:
    """(tensors the garbage collector tracks, bytes of their distinct storages) after a full collection."""
    gc.collect()
    count, storages = 0, {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor):
            count += 1
            if o.layout == torch.strided and not o.is_meta:
                s = o.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
    return count, sum(storages.values())


# Tensors that may be alive at one step boundary and not the next: an alltoall table's prefetch still in flight
# when the sample is taken (seen: 231, 232, 231 live tensors on one rank of the prepared loop). A step that keeps
# one tensor adds EVERY between two samples, one that keeps one every few steps several.
TRANSIENT = 2


def _assert_flat(samples: list[tuple[int, int]]) -> None:
    counts = [c for c, _ in samples]
    assert max(counts) - min(counts) <= TRANSIENT, f"live tensors grow step by step: {samples}"
    grew = samples[-1][1] - samples[0][1]
    assert grew <= SLACK, f"live tensor bytes grew by {grew} over {EVERY * (len(samples) - 1)} steps: {samples}"


def run_composed(extra: list[str]) -> tuple[list[tuple[int, int]], int]:
    """Train the composed Transformer LM as ``tessel train`` does, sampling live tensors every EVERY steps;
    returns the samples and how many tables this rank serves (a pipeline's last stage holds none)."""
    cfg = load_config(None, ["model.name=transformer_lm", f"model.dim={D}", "model.layers=2", "model.heads=2",
                             "data.vocab_size=256", f"data.seq_len={T}", f"train.global_batch={B}",
                             f"train.steps={STEPS}", "sparse.max_touched=1.0", *extra])
    plan, settings = planned(cfg)
    mesh = build_mesh(plan.dims, 20, plan.mesh_axes)
    data = build_data(cfg)
    torch.manual_seed(1)
    dp = mesh.get_local_rank("dp")
    peek = ShardedLoader(data, B, dp, plan.dp)
    par = parallelize(build(cfg, data.vocab_size), plan, mesh, [peek.next_batch(), peek.next_batch()], settings)
    loader, samples = ShardedLoader(data, B, dp, plan.dp), []
    for step in range(STEPS):
        x, y = loader.next_batch()
        par.engine.step(x, y, step, loader.peek())
        if (step + 1) % EVERY == 0:
            samples.append(live_tensors())
    par.engine.drain(STEPS)
    return samples, len(par.tables.tables) if par.tables else 0


class Clicks(nn.Module):
    def __init__(self):
        super().__init__()
        self.items = nn.Embedding(200, D)
        self.out = nn.Linear(D, 2)

    def forward(self, items, y):  # items (b, 4), y (b,)
        return F.cross_entropy(self.out(self.items(items).mean(1)), y)


def run_prepared(plan: str) -> list[tuple[int, int]]:
    """A user's own loop under ``tessel.prepare``, sampling live tensors every EVERY steps."""
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(2)
    data = [(torch.randint(0, 200, (B, 4), generator=g), torch.randint(0, 2, (B,), generator=g))
            for _ in range(STEPS)]
    model = Clicks()
    model, opt, loader = tessel.prepare(model, torch.optim.Adagrad(model.parameters(), lr=0.1), data, plan=plan)
    samples = []
    for step, (items, y) in enumerate(loader):
        model(items, y).backward()
        tessel.clip_grad_norm_(model, 1.0)
        opt.step()
        opt.zero_grad()
        if (step + 1) % EVERY == 0:
            samples.append(live_tensors())
    return samples


CASES = {
    "ps": ["sparse.strategy=ps"],
    "allgather": ["sparse.strategy=allgather"],
    "alltoall-scheduled": ["sparse.strategy=alltoall", "sparse.schedule=true"],
    "alltoall-unscheduled": ["sparse.strategy=alltoall", "sparse.schedule=false"],
    "pp2-ps-1f1b": ["sparse.strategy=ps", "parallel.pp=2", "parallel.dp=2", "pipeline.split=2,2",
                    "train.micro_batches=2"],
    "pp2-alltoall-async-predict": ["sparse.strategy=alltoall", "parallel.pp=2", "parallel.dp=2",
                                   "pipeline.split=2,2", "pipeline.schedule=async-predict"],
    "tp2-ps": ["sparse.strategy=ps", "parallel.tp=2", "parallel.dp=2", "tensor.mode=1d"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_served_tables_keep_nothing_per_step(world4, case):
    results = world4.run(run_composed, CASES[case])
    assert sum(served for _, served in results), "the case serves no table"
    for samples, _ in results:
        _assert_flat(samples)


@pytest.mark.parametrize("plan", ["ps", "alltoall"])
def test_prepared_loop_keeps_nothing_per_step(world2, plan):
    for samples in world2.run(run_prepared, plan):
        _assert_flat(samples)


def test_every_rank_records_its_own_memory_over_time(world2, tmp_path):
    """The logging rank's memory goes in metrics.jsonl each step; every other rank writes its resident set and its
    allocator's bytes in use every log_every steps to memory-rank<r>.jsonl (kept up to the checkpoint on resume),
    so growth on any one rank can be told from fragmentation there."""
    import json

    from test_cli import TINY
    from trained import train

    out = tmp_path / "run"
    train(world2, tmp_path, *TINY, "--steps", "20", "--metrics.log_every", "5", "--ckpt-every", "10", "--out", str(out))
    files = sorted(p.name for p in out.glob("memory-rank*.jsonl"))
    assert files == ["memory-rank1.jsonl"], files  # rank 0 logs (metrics.jsonl)
    recs = [json.loads(line) for line in (out / "memory-rank1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [5, 10, 15, 20]
    assert all(2**20 < r["rss"] and 0 < r["heap"] < r["rss"] and 0 < r["anon"] < r["rss"] for r in recs)
    (out / "checkpoints" / "step-00000020").rename(out / "checkpoints" / "later")  # resume from step 10
    train(world2, tmp_path, *TINY, "--steps", "20", "--metrics.log_every", "5", "--resume", "--out", str(out))
    again = [json.loads(line)["step"] for line in (out / "memory-rank1.jsonl").read_text().splitlines()]
    assert again == [5, 10, 15, 20]


def test_release_free_hands_malloc_s_free_holes_back_every_release_every_steps():
    """What the resident set keeps that no tensor holds: free holes between live allocations, which glibc returns
    only from an arena's top. 2,000 touched 64 KiB tensors (under malloc's mmap threshold, so from the heap), every
    other one freed: ~64 MB of holes. ``release_free`` trims on its cadence only, and then gives most back."""
    from tessel.train.memory import RELEASE_EVERY, release_free, resident_bytes

    tensors = [torch.ones(16384) for _ in range(2000)]
    kept = tensors[::2]
    del tensors
    assert not release_free(RELEASE_EVERY + 1)
    before = resident_bytes()
    assert release_free(3 * RELEASE_EVERY)
    assert before - resident_bytes() > 32e6, (before, resident_bytes())
    assert all(float(t[0]) == 1.0 for t in kept)  # what is alive is untouched
