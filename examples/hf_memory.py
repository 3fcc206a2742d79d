"""What one training step of a Hugging Face Llama with a 128K-word vocabulary adds to each rank's tensors at its
peak, under ``tessel.prepare`` with two pipeline stages (2 micro-batches of 16 sequences of 32 tokens).

The last stage holds the head: unfused, its (512, 131072) fp32 logits are 256 MiB a micro-batch, and the loss's
log-softmax and gradient as much again each; tessel computes transformers' causal-LM loss fused with ``lm_head``
a block of rows at a time (tessel/hf.py), so they are never made whole. The losses print so two code versions can
be compared step by step.

    tessel run --nproc 2 examples/hf_memory.py
"""

import contextlib

import numpy as np
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import tessel
from tessel.data.zipf import ZipfCorpus
from tessel.train.memory import PeakTensors

VOCAB, SEQ, BATCH, STEPS, MEASURED = 131072, 32, 32, 6, 2

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
corpus = ZipfCorpus(vocab_size=VOCAB, seq_len=SEQ + 1, seed=0)
batches = []
for b in range(STEPS):
    ids = torch.as_tensor(corpus.tokens(np.arange(b * BATCH, (b + 1) * BATCH)), dtype=torch.long)[:, :SEQ]
    batches.append({"input_ids": ids, "labels": ids.clone()})
model, optimizer, loader = tessel.prepare(model, optimizer, batches, verbose=False,
                                          plan=tessel.ParallelPlan(dp=1, pp=2, micro_batches=2))
losses = []
for i, batch in enumerate(loader):
    # one step after the optimizer's state exists: what a step adds at its peak, beyond what a rank holds
    with PeakTensors() if i == MEASURED else contextlib.nullcontext() as peak:
        losses.append(float(model.step(batch)))
    if i == MEASURED:
        added = (peak.bytes - peak.entry) / 2**20
print(f"rank {dist.get_rank()} (stage {dist.get_rank()}): step {MEASURED + 1} added {added:.1f} MiB at its peak; "
      f"losses {' '.join(f'{x:.4f}' for x in losses)}", flush=True)
