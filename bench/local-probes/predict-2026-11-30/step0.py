"""Stage 0 of the pipeline scenario's classifier (2 layers of 1024 x 1024, ReLU) at pp4 m4 under async-predict v1,
one process, one thread: per step 4 micro-batches of 32 rows, the first 3 predicted one update ahead (one weight
version), the 4th on the live weights, then SGD (momentum 0.9). CPU ms per step with the forwards' Ŵ shared
(this commit) and made per forward (sharing defeated), alternating, median of 10 steps per round."""
import statistics, sys, time, torch
from torch.func import functional_call
from tessel.pipeline.predict import StageWeights
torch.set_num_threads(1); torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU())
params = dict(net.named_parameters())
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
xs = [torch.randn(32, 1024) for _ in range(4)]; gs = [torch.randn(32, 1024) for _ in range(4)]

def step(sw, share):
    for i in range(4):
        if not share:
            sw._shared = None
        made = sw.make(1 if i < 3 else 0)
        x = xs[i].clone().requires_grad_(True)
        if made is None:
            out = net(x)
        else:
            weights, leaves, ctx, _ = made
            with ctx:
                out = functional_call(net, weights, (x,))
            del weights
        torch.autograd.backward(out, gs[i])
        if made is not None:
            for n, leaf in leaves.items():
                p = params[n]
                p.grad = leaf.grad if p.grad is None else p.grad.add_(leaf.grad)
    opt.step(); opt.zero_grad(); sw.updates += 1

sw = StageWeights(params, opt, "predict", stage=0, stages=4, variant="v1", micro=4)
res = {True: [], False: []}
for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    for share in ((True, False) if rd % 2 == 0 else (False, True)):
        ts = []
        for _ in range(13):
            c = time.thread_time(); step(sw, share); ts.append(time.thread_time() - c)
        res[share].append(statistics.median(ts[3:]) * 1e3)
from tessel.bench.stats import paired_ratio
print("shared", [round(v, 1) for v in res[True]]); print("per forward", [round(v, 1) for v in res[False]])
print("per-forward over shared:", paired_ratio(dict(enumerate(res[False])), dict(enumerate(res[True]))),
      "median saved ms", round(statistics.median(a - b for a, b in zip(res[False], res[True])), 2))
