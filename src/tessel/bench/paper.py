"""Projections to the seeds' clusters, on paper: the planner's choice and predicted ratios where the papers
measured theirs. The machines are not here, so compute comes from FLOP counts at an assumed sustained rate
instead of a profile, and links from the clusters' published descriptions; these are projections.

    python -m tessel.bench.paper      # the two tables docs/planner.md quotes
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..chain import chain_of
from ..config import load_config
from ..data.loader import ShardedLoader
from ..meta import on_meta
from ..models.sampled_softmax import SampledSoftmax
from ..pipeline.layers import stage_params
from ..plan import ParallelPlan, TablePolicy
from ..planner import choose
from ..planner.estimate import estimate
from ..planner.profile import LayerProfile, Profile, TableProfile
from ..planner.topology import PARALLAX_CLUSTER, TACC_CLUSTER
from ..registry import spec_of
from ..resolve import job_of, policy_of, settings_of
from ..sparse import find_tables
from ..train.build import build, build_data


def _flops_per_row(module: nn.Module, seq: int) -> float:
    """Forward + backward FLOPs per row (token or sample) of the GEMM-like modules in ``module``."""
    total = 0.0
    for m in module.modules():
        if isinstance(m, nn.Linear):
            total += 6 * m.in_features * m.out_features
        elif isinstance(m, nn.LSTM):
            for layer in range(m.num_layers):
                inp = m.input_size if layer == 0 else (m.proj_size or m.hidden_size)
                out = m.proj_size or m.hidden_size
                total += 6 * 4 * m.hidden_size * (inp + out) + (6 * m.hidden_size * m.proj_size if m.proj_size else 0)
        elif isinstance(m, SampledSoftmax):
            total += 6 * m.dim * (m.num_sampled + 1)
        elif m.__class__.__name__ == "CausalSelfAttention":
            total += 12 * seq * m.q_proj.in_features  # scores and context, forward + backward
    return total


def analytic(cfg, flops: float, samples_for_tables: tuple[int, ...] = (1,), elem: int = 4,
             per_elem: float = 3e-11) -> Profile:
    """A :class:`Profile` of ``cfg``'s model from FLOP counts at ``flops`` per second (no timing, no weights: the
    model is built on the meta device; the tables' unique rows are counted on real batches of its data).
    ``elem``: bytes per element on the wire; ``per_elem``: optimizer seconds per parameter element."""
    data = build_data(cfg)
    vocab = getattr(data, "vocab_size", 0)
    with on_meta():
        model = build(cfg, vocab)
    chain = chain_of(model)
    seq = cfg.data.seq_len
    x, _ = ShardedLoader(data, cfg.train.global_batch, 0, 1).next_batch()
    rows = x.shape[1] if x.dim() > 1 and not x.is_floating_point() else 1
    h = x[:1].to("meta") if not x.is_floating_point() else torch.empty(1, *x.shape[1:], device="meta")
    spec = spec_of(model)
    linears = spec.linears(model) if spec.linears else [[] for _ in chain.layers]
    tables = _tables(cfg, model, data, samples_for_tables)
    layers = []
    for i, layer in enumerate(chain.layers):
        h = layer.run(model, h)
        per_row = sum(_flops_per_row(model.get_submodule(p), seq) for p in layer.owns)
        if i + 1 == len(chain.layers) and cfg.model.softmax == "sampled":
            per_row += _flops_per_row(model.head, seq)  # the loss runs the sampled head on the last stage
        params = sum(p.numel() for p in stage_params(model, chain, i, i + 1).values())
        owns = tuple(t.name for t in tables if any(t.name == o or t.name.startswith(o + ".") for o in layer.owns))
        layers.append(LayerProfile(layer.name, 0.0, per_row * rows / flops, params, math.prod(h.shape[1:]), owns,
                                   tuple(linears[i])))
    return Profile(layers, tables, elem, per_elem, rows, job=job_of(cfg))


def _tables(cfg, model, data, dps) -> list[TableProfile]:
    out = []
    for info in find_tables(model):
        t = TableProfile(info.name, info.rows, info.dim, info.name in ("embedding", "tok_emb"))
        for dp in dps:
            x, y = ShardedLoader(data, cfg.train.global_batch, 0, dp).next_batch()
            ids = x if t.fed else y  # the softmax's rows: the targets and the shared samples
            extra = cfg.model.num_sampled if not t.fed else 0
            t.unique[dp] = min(info.rows, float(torch.unique(ids).numel()) + extra)
        out.append(t)
    return out


# The seeds' settings as far as the public sources tell (docs/planner.md says which parts are assumed).
PARALLAX_LM = ["model.name=lstm_lm", "model.dim=512", "model.hidden=2048", "model.layers=1", "model.softmax=sampled",
               "model.num_sampled=8192", "data.vocab_size=800000", "data.seq_len=20", "train.global_batch=6144",
               "train.optimizer=adagrad"]
TITAN_XP_FLOPS = 5e12  # sustained fp32 (about 40% of the TITAN Xp's 12 TFLOP/s peak)
BLOCKS = ["model.name=transformer_lm", "model.dim=8192", "model.heads=64", "model.layers=2", "data.vocab_size=8192",
          "data.seq_len=2048", "train.global_batch=32", "sparse.strategy=dense"]
V100_FLOPS = 50e12  # sustained fp16 GEMM (40% of 125 TFLOP/s), as tessel.tensor.cost.Cluster


def parallax() -> tuple[dict, str]:
    """Hybrid (tables by rows) against dense data parallelism on 48 GPUs, and the planner's own choice."""
    cfg = load_config(None, PARALLAX_LM)
    profile = analytic(cfg, TITAN_XP_FLOPS, (48, 24, 16, 1))
    topo, settings = PARALLAX_CLUSTER, settings_of(cfg)
    hybrid = estimate(ParallelPlan(dp=48, sparse=policy_of(cfg)), settings, profile, topo)
    dense = estimate(ParallelPlan(dp=48, sparse=TablePolicy(strategy="dense")), settings, profile, topo)
    best = choose(profile.job, topo, profile=profile).best
    rows = {"hybrid": hybrid, "dense": dense, "chosen": best}
    return rows, _table(rows, "dense", "Parallax: hybrid vs dense data parallelism on an LM (48 GPUs, 8 machines); "
                        "paper: up to 6.02x over Horovod (dense all-reduce), 2.8x over TensorFlow's PS")


def tacc() -> tuple[dict, str]:
    """3-D against 1-D and 2-D tensor parallelism over 64 V100s in nodes of 4."""
    cfg = load_config(None, BLOCKS)
    profile = analytic(cfg, V100_FLOPS, (1,), elem=2)
    plan = ParallelPlan(dp=1, sparse=policy_of(cfg))
    rows = {mode: estimate(plan.with_(tp=64, tp_mode=mode, tp_grid=grid), settings_of(cfg), profile, TACC_CLUSTER)
            for mode, grid in (("1d", (64,)), ("2d", (8, 8)), ("3d", (4, 4, 4)))}
    return rows, _table(rows, "3d", "3-D paper: 3-D vs 1-D and 2-D tensor parallelism (64 V100, nodes of 4); "
                        "paper: 2.32x over 1-D, 1.57x over 2-D", invert=True)


def _table(rows: dict, ref: str, title: str, invert: bool = False) -> str:
    lines = [f"**{title}** (projection)", "",
             "| plan | predicted step ms | compute | comm | bubble | MiB sent per rank | ratio |",
             "|---|---|---|---|---|---|---|"]
    for name, e in rows.items():
        ratio = rows[ref].step / e.step if not invert else e.step / rows[ref].step
        sent = sum(e.bytes.values()) / 2**20
        lines.append(f"| {name}: {e.plan.describe().removeprefix('plan: ')} | {e.step * 1e3:.1f} | "
                     f"{e.compute * 1e3:.1f} | "
                     f"{e.comm * 1e3:.1f} | {e.bubble * 1e3:.1f} | {sent:,.1f} | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for fn in (parallax, tacc):
        print(fn()[1])
