import time, torch, statistics, sys
torch.set_num_threads(1)
torch.manual_seed(0)
emb = torch.nn.Embedding(4096, 64); lstm = torch.nn.LSTM(64, 256, num_layers=2, proj_size=64, batch_first=True)
opt = torch.optim.SGD([*emb.parameters(), *lstm.parameters()], lr=0.01)
cpu, wall = [], []
for _ in range(20):
    xs = [torch.randint(0, 4096, (4, 32)) for _ in range(8)]
    gs = [torch.randn(4, 32, 64) for _ in range(8)]
    c, t = time.thread_time(), time.perf_counter()
    outs = [lstm(emb(x))[0] for x in xs]  # GPipe: every forward, then every backward
    for h, g in zip(outs, gs):
        h.backward(g)
    opt.step(); opt.zero_grad()
    cpu.append(time.thread_time() - c); wall.append(time.perf_counter() - t)
print(f"alone cpu_ms_per_step {statistics.median(cpu[2:])*1e3:.1f} wall_ms_per_step {statistics.median(wall[2:])*1e3:.1f}")
