import time, torch, statistics, sys
torch.set_num_threads(1)
emb = torch.nn.Embedding(4096, 64); lstm = torch.nn.LSTM(64, 256, num_layers=2, proj_size=64, batch_first=True)
xs = [torch.randint(0, 4096, (4, 32)) for _ in range(8)]
g = torch.randn(4, 32, 64)
ts = []
for _ in range(12):
    t = time.perf_counter()
    for x in xs:
        h, _ = lstm(emb(x)); h.backward(g)
    ts.append(time.perf_counter() - t)
print(sys.argv[1], round(statistics.median(ts[2:]) * 1e3 / 8, 2), "ms per micro-batch")
