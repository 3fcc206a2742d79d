# the step tail (clip + SGD momentum) in one idle process over 4.2M elements and a quarter: CPU ms, median of 8
import statistics, time, torch
from tessel.train.tail import StepTail
torch.set_num_threads(1)
for n in (4, 1):
    ps = [torch.nn.Parameter(torch.randn(1024, 1024)) for _ in range(n)]
    tail = StepTail(ps, torch.optim.SGD(ps, lr=0.01, momentum=0.9), clip=1.0)
    for p in ps: p.grad = torch.ones_like(p)
    tail(0.01); ts = []
    for _ in range(8):
        for p in ps: p.grad = torch.ones_like(p)
        c0 = time.thread_time(); tail(0.01); ts.append(time.thread_time() - c0)
    print(f"idle, one process, {n}M elements: cpu ms {statistics.median(ts) * 1e3:.1f}")
