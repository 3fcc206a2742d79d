import time, torch, statistics
torch.set_num_threads(1)
torch.manual_seed(0)
emb = torch.nn.Embedding(4096, 64); lstm = torch.nn.LSTM(64, 256, num_layers=2, proj_size=64, batch_first=True)
def fwd(x):
    h, _ = lstm(emb(x)); return h
xs = [torch.randint(0, 4096, (4, 32)) for _ in range(8)]
g = torch.randn(4, 32, 64)
def A():
    for x in xs:
        fwd(x).backward(g)
def B():
    outs = [fwd(x) for x in xs]
    for o in outs: o.backward(g)
def F():
    with torch.no_grad():
        for x in xs: fwd(x)
def Bonly():
    outs = [fwd(x) for x in xs]
    t = time.perf_counter()
    for o in outs: o.backward(g)
    return time.perf_counter() - t
for name, f in [("interleaved", A), ("all-fwd-then-bwd", B), ("fwd-nograd", F)] * 4:
    ts = []
    for _ in range(5):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    print(name, round(statistics.median(ts) * 1e3 / 8, 2), "ms per micro-batch")
print("bwd only (gpipe)", round(statistics.median([Bonly() for _ in range(5)]) * 1e3 / 8, 2))
