"""What one forward keeps for backward under each ``train.recompute`` policy, measured by the allocator.

The default Transformer LM (``tessel train``'s model, dense tables) at one rank's share of the default batch (16
sequences of 64 tokens), in one process: glibc's bytes in use after the forward minus before it
(``tessel.train.memory.allocator_bytes``), the second of two forwards (the first warms the allocator). Run as
``python examples/activation_memory.py [--layers 2,8]``.
"""

from __future__ import annotations

import argparse
import gc

import torch

from tessel.chain import Runner, chain_of, recomputed
from tessel.config import load_config
from tessel.data import ShardedLoader
from tessel.train.build import build, build_data
from tessel.train.memory import allocator_bytes


def kept_mib(layers: int) -> tuple[str, dict[str, float]]:
    cfg = load_config(None, ["sparse.strategy=dense", f"model.layers={layers}"])
    data = build_data(cfg)
    torch.manual_seed(0)
    model = build(cfg, data.vocab_size)
    x, y = ShardedLoader(data, 16, 0, 1).next_batch()
    out = {}
    for policy in ("none", "layers", "selective"):
        chain = chain_of(model)
        if policy != "none":
            chain = recomputed(chain, model, keep_matmuls=policy == "selective")
        run = Runner(model, chain)
        for _ in range(2):
            gc.collect()
            before = allocator_bytes()
            loss = run(x, y)
            kept = allocator_bytes() - before
            loss.backward()
            model.zero_grad(set_to_none=True)
            del loss
        out[policy] = kept / 2**20
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return (f"{layers} layers, dim {cfg.model.dim}, vocabulary {data.vocab_size}, {params:.2f}M parameters", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="2,8")
    torch.set_num_threads(1)
    for layers in (int(n) for n in ap.parse_args().layers.split(",")):
        what, kept = kept_mib(layers)
        print(f"{what}: kept for backward " + ", ".join(f"{k} {v:.1f} MiB" for k, v in kept.items()))


if __name__ == "__main__":
    main()
