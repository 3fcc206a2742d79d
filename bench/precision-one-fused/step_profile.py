"""Where the default model's one-process step goes in fp32 and in bf16-mixed (docs/benchmarks.md, "The fused
loss, built"): the default Transformer LM (vocabulary 8192, 64 tokens, width 128, 2 layers, 4 heads),
batch 32, AdamW, in a plain torch loop. Prints the median step (the 6th of 10 sorted, after 3 warm-up) twice each
way, then, with --prof, a torch profile of 5 steps each way, and a 512 x 512 product's time in both widths.

    python bench/precision-one-fused/step_profile.py 1 --prof > bench/precision-one-fused/step_profile.log   # 1: torch threads
"""

import sys
import time

import torch

from tessel.models.transformer_lm import TransformerLM

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
torch.manual_seed(0)
model = TransformerLM(vocab_size=8192, seq_len=64, dim=128, layers=2, heads=4, dropout=0.0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randint(0, 8192, (32, 64)), torch.randint(0, 8192, (32, 64))


def step(bf16: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def median_ms(bf16: bool) -> float:
    for _ in range(3):
        step(bf16)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        step(bf16)
        times.append(time.perf_counter() - t0)
    return round(1e3 * sorted(times)[5], 1)


for bf16 in (False, True, False, True):
    print("bf16" if bf16 else "fp32", "median ms", median_ms(bf16))
if "--prof" in sys.argv:
    from torch.profiler import profile

    for bf16 in (False, True):
        with profile() as p:
            for _ in range(5):
                step(bf16)
        print("bf16" if bf16 else "fp32")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
a = torch.randn(512, 512)
for name, u in (("fp32", a), ("bf16", a.bfloat16())):
    for _ in range(3):
        u @ u
    t0 = time.perf_counter()
    for _ in range(20):
        u @ u
    print(name, "512 matmul ms", round((time.perf_counter() - t0) / 20 * 1e3, 2))
