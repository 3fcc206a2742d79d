import time, torch, statistics, sys, os
torch.set_num_threads(1)
mode = sys.argv[1]
if mode != "plain":
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
if mode == "tessel":
    import tessel.trainer, tessel.comm  # noqa
emb = torch.nn.Embedding(4096, 64); lstm = torch.nn.LSTM(64, 256, num_layers=2, proj_size=64, batch_first=True)
xs = [torch.randint(0, 4096, (4, 32)) for _ in range(8)]
g = torch.randn(4, 32, 64)
ts = []
for _ in range(12):
    t = time.perf_counter()
    for x in xs:
        h, _ = lstm(emb(x)); h.backward(g)
    ts.append(time.perf_counter() - t)
print(mode, round(statistics.median(ts[2:]) * 1e3 / 8, 2), "ms per micro-batch")
