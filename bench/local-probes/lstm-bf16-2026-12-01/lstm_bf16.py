"""The sparse scenario's LSTM LM on one rank's share (batch 8 of 32, 64 tokens), one thread: forward + backward of
the whole model in fp32, under bf16 autocast, and under bf16 autocast with the LSTM in fp32; rounds alternate."""
import time, statistics, torch, sys
from tessel.models import LSTMLM
torch.set_num_threads(1)
torch.manual_seed(0)
B, T = 8, 64
m = LSTMLM(vocab_size=200000, dim=128, hidden=512, softmax="sampled", num_sampled=256)
x = torch.randint(0, 200000, (B, T)); y = torch.randint(0, 200000, (B, T))
def fwd_fp32_lstm(inputs, targets):
    e = m.embedding(inputs)
    low = torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", enabled=False):
        out, _ = m.lstm(e.to(low).float())
    h = m.drop(out.to(low))
    return m.head(h.reshape(-1, m.dim), targets.reshape(-1))
def step(mode):
    t0 = time.thread_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
        loss = fwd_fp32_lstm(x, y) if mode == "bf16+fp32lstm" else m(x, y)
    loss.backward()
    m.zero_grad(set_to_none=True)
    return time.thread_time() - t0
modes = ["fp32", "bf16", "bf16+fp32lstm"]
res = {k: [] for k in modes}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for mode in (modes if r % 2 == 0 else modes[::-1]):
        ts = [step(mode) for _ in range(6)]
        res[mode].append(statistics.median(ts[1:]))
for k, v in res.items():
    print(f"{k:14s} median {statistics.median(v)*1e3:6.1f} ms  rounds {[round(t*1e3,1) for t in v]}")
