# every rank at once: SGD-momentum + clip over n parameter elements (the classifier's 4.3M, and a quarter), wall time
import json, statistics, time, torch, torch.distributed as dist
from tessel.train.tail import StepTail
dist.init_process_group("gloo"); torch.set_num_threads(1)
out = {}
for n_layers, label in ((4, "whole"), (1, "quarter")):
    ps = [torch.nn.Parameter(torch.randn(1024, 1024)) for _ in range(n_layers)]
    for p in ps: p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(ps, lr=0.01, momentum=0.9)
    tail = StepTail(ps, opt, clip=1.0)
    def step():
        for p in ps: p.grad = torch.randn_like(p) if p.grad is None else p.grad
        tail(0.01)
    for p in ps: p.grad = torch.zeros_like(p)
    step(); dist.barrier()
    wall, cpu = [], []
    for _ in range(8):
        for p in ps: p.grad = torch.ones_like(p)
        t0, c0 = time.perf_counter(), time.thread_time(); tail(0.01)
        wall.append(time.perf_counter() - t0); cpu.append(time.thread_time() - c0)
    out[label] = {"elements": n_layers << 20, "wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3}
    dist.barrier()
allr = [None] * dist.get_world_size(); dist.all_gather_object(allr, out)
if dist.get_rank() == 0: print(json.dumps(allr))
dist.destroy_process_group()
