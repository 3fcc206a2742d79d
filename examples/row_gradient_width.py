"""Which width should a table's row gradients cross in under bf16-mixed? Measured on the gradients a real
step makes, in one process.

Under bf16-mixed a served table's looked-up rows cross in bf16 (the forward rounds them to bf16 anyway), but each
rank's row gradients are summed on the rows' owner (ps, alltoall, allgather), over ranks and, with local
aggregation, first over a host's ranks. Sent in bf16, every contribution would be rounded before that sum. This
script takes the gradients a bf16-mixed step computes on each of ``--ranks`` shards of a global batch and sums
them the three ways a run could: every contribution in fp32 (what tessel sends), every contribution rounded to
bf16 (a bf16 push without local aggregation), and each host's fp32 sum rounded to bf16 (a bf16 push after local
aggregation, ``--hosts``). Each is compared with the same sum computed in fp64 without autocast (the exact
gradient), and the bf16 push also with the fp32 push (what the rounding of the push alone adds), over the rows
the step touched: the relative error of the summed rows (Frobenius) and the median and
99th percentile of each row's own relative error. "bf16 compute" is the fp32 sum's error: what bf16-mixed's
forward and backward already cost, before anything is sent.

    python examples/row_gradient_width.py                                    # LSTM LM, sampled softmax, 4 ranks
    python examples/row_gradient_width.py --model transformer_lm --batches 4
"""

from __future__ import annotations

import argparse

import torch

from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.sparse.detect import find_tables
from tessel.train.build import build, build_data

MODELS = {"lstm_lm": ["model.name=lstm_lm", "model.softmax=sampled", "model.dim=64", "data.vocab_size=20000"],
          "transformer_lm": ["model.name=transformer_lm", "model.dim=64", "data.vocab_size=8192"]}


def shard_grads(model: torch.nn.Module, names: list[str], x, y, autocast: bool, rng: torch.Tensor
                ) -> dict[str, torch.Tensor]:
    """Each table's weight gradient from one shard's loss (a rank's part of the step's gradient, up to the
    1/ranks of the mean every way of summing shares)."""
    model.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)  # the sampled softmax draws the same candidates in every precision
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, y)
    loss.float().backward()
    return {n: model.get_submodule(n).weight.grad.detach().clone() for n in names}


def errors(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float, float]:
    """(relative Frobenius error over touched rows, median and 99th percentile of each touched row's own)."""
    rows = exact.abs().sum(1) > 0
    g, e = got[rows].double(), exact[rows]
    per_row = (g - e).norm(dim=1) / e.norm(dim=1)
    return float((g - e).norm() / e.norm()), float(per_row.median()), float(per_row.quantile(0.99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lstm_lm", choices=list(MODELS))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=2, help="hosts the ranks fill in order (local aggregation)")
    ap.add_argument("--batches", type=int, default=2, help="global batches measured (after --warm steps)")
    ap.add_argument("--warm", type=int, default=20, help="AdamW steps trained first, so the weights are not fresh")
    ap.add_argument("--global-batch", type=int, default=32)
    a = ap.parse_args()
    if a.ranks % a.hosts or a.global_batch % a.ranks:
        ap.error(f"--hosts {a.hosts} must divide --ranks {a.ranks}, and --ranks the --global-batch {a.global_batch}")
    cfg = load_config(None, [*MODELS[a.model], f"train.global_batch={a.global_batch}"])
    data = build_data(cfg)
    torch.manual_seed(0)
    model = build(cfg, data.vocab_size)
    names = [t.name for t in find_tables(model)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = ShardedLoader(data, a.global_batch, 0, 1)
    for _ in range(a.warm):  # fp32, one process: weights a run has moved
        x, y = train.next_batch()
        model(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    exact_model = build(cfg, data.vocab_size).double()
    exact_model.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    per_host = a.ranks // a.hosts
    ways = {"bf16 compute, fp32 push": [], "bf16 push, each rank": [], "bf16 push, each host's sum": [],
            "bf16 push, each rank, against the fp32 push (the push's own rounding)": []}
    shards = [ShardedLoader(data, a.global_batch, r, a.ranks) for r in range(a.ranks)]
    for s in shards:  # the global batches after the ones trained on
        for _ in range(a.warm):
            s.next_batch()
    for b in range(a.batches):
        batch = [s.next_batch() for s in shards]
        rngs = [torch.manual_seed(1000 * b + r).get_state() for r in range(a.ranks)]  # each rank draws its own
        exact = [shard_grads(exact_model, names, x, y, False, rng) for (x, y), rng in zip(batch, rngs)]
        mixed = [shard_grads(model, names, x, y, True, rng) for (x, y), rng in zip(batch, rngs)]
        for n in names:
            want = sum(g[n] for g in exact)
            hosts = [sum(g[n] for g in mixed[h * per_host:(h + 1) * per_host]) for h in range(a.hosts)]
            ways["bf16 compute, fp32 push"].append(errors(sum(g[n] for g in mixed), want))
            ways["bf16 push, each rank"].append(errors(sum(g[n].bfloat16().float() for g in mixed), want))
            ways["bf16 push, each host's sum"].append(errors(sum(h.bfloat16().float() for h in hosts), want))
            fp32_push = sum(g[n] for g in mixed).double()
            ways["bf16 push, each rank, against the fp32 push (the push's own rounding)"].append(
                errors(sum(g[n].bfloat16().float() for g in mixed), fp32_push))
    print(f"{a.model}: tables {', '.join(names)}; {a.ranks} ranks on {a.hosts} hosts, global batch "
          f"{a.global_batch}, {a.batches} batches after {a.warm} steps; error against the fp64 sum, touched rows")
    print("| sum | relative error (all rows) | per row, median | per row, 99th pct |")
    print("|---|---|---|---|")
    for way, errs in ways.items():
        cols = [sum(e[i] for e in errs) / len(errs) for i in range(3)]
        print(f"| {way} | {cols[0]:.2e} | {cols[1]:.2e} | {cols[2]:.2e} |")


if __name__ == "__main__":
    main()
