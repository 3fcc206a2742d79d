"""A Hugging Face Llama trained with tessel from a plain loop, then saved as a Hugging Face model.

A small Llama built from a config (no download), a loader that yields dicts as Hugging Face loaders do
(``input_ids``, ``attention_mask``, ``labels``; tokens from tessel's embedded Zipf corpus), AdamW with a cosine
schedule, clipping. ``tessel.prepare`` finds the Llama's layer chain and tensor-parallel plan by its class::

    tessel run --nproc 4 examples/hf_llama.py --plan dp2-pp2 --out llama-pp     # 2 replicas of 2 pipeline stages
    tessel run --nproc 4 examples/hf_llama.py --plan auto --out llama-auto      # data parallel, tables decided

With a pipeline the loop calls ``model.step(batch)`` (forwards, backwards, clipping and the update of one step);
data parallel, it keeps its own forward, backward and ``optimizer.step()``. Either way ``tessel.unwrap`` gives the
trained ``LlamaForCausalLM`` back whole on every rank, and rank 0 saves it with ``save_pretrained``; the script
loads the folder with ``from_pretrained`` and prints both held-out losses (they are the same model).
Needs ``pip install 'tessel[hf]'``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
import torch.distributed as dist

import tessel
from tessel.data.zipf import ZipfCorpus

VOCAB, SEQ, BATCH = 1024, 32, 16


def batches(corpus: ZipfCorpus, first: int, count: int) -> list[dict]:
    """``count`` global batches as a Hugging Face loader yields them (a causal LM's labels are its inputs)."""
    out = []
    for b in range(first, first + count):
        ids = torch.as_tensor(corpus.tokens(np.arange(b * BATCH, (b + 1) * BATCH)), dtype=torch.long)[:, :SEQ]
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def main(argv: list[str]) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    p = argparse.ArgumentParser()
    p.add_argument("--plan", choices=("dp2-pp2", "auto"), default="dp2-pp2")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", default="llama-out")
    args = p.parse_args(argv)

    torch.manual_seed(0)  # the same initial weights on every rank
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps, eta_min=3e-4)
    corpus = ZipfCorpus(vocab_size=VOCAB, seq_len=SEQ + 1, seed=0)
    piped = args.plan == "dp2-pp2"
    plan = tessel.ParallelPlan(dp=2, pp=2, micro_batches=2) if piped else "auto"
    model, optimizer, loader = tessel.prepare(model, optimizer, batches(corpus, 0, args.steps), plan=plan,
                                              max_norm=1.0 if piped else 0.0)
    for step, batch in enumerate(loader):
        if piped:
            loss = model.step(batch)  # the global batch's mean loss, on every rank
        else:
            loss = model(**batch).loss
            loss.backward()
            tessel.clip_grad_norm_(model, 1.0)
            optimizer.step()
            optimizer.zero_grad()
        schedule.step()
        if dist.get_rank() == 0 and (step % 10 == 0 or step + 1 == args.steps):
            print(f"step {step:>3}  loss {float(loss):.4f}  lr {schedule.get_last_lr()[0]:.2e}", flush=True)

    held = batches(corpus, 10**6, 1)[0]  # a batch no step trained on
    # every rank its slice, forwards only (through the stages under pp): the batch's mean loss on every rank
    evaluated = [float(model.evaluate(b)) for b in loader.sliced([held])][0]
    trained = tessel.unwrap(model)  # every rank: the whole LlamaForCausalLM, every stage and table put back
    if dist.get_rank() == 0:
        print(f"held-out loss {evaluated:.4f} by model.evaluate", flush=True)
        trained.save_pretrained(args.out)
        loaded = LlamaForCausalLM.from_pretrained(args.out)
        with torch.no_grad():
            a, b = float(trained(**held).loss), float(loaded(**held).loss)
        print(f"saved {args.out}: held-out loss {a:.4f} trained, {b:.4f} loaded with from_pretrained", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    tessel.shutdown()
