"""A Transformer stage of the pipeline scenario (4 blocks of width 128, 8 sequences of 32 a micro-batch), one
thread: forward and backward CPU ms as a module call, and as a predicted forward on a shared Ŵ (functional_call,
the saved-tensor hooks, the leaves' gradients added to the parameters'), 10 rounds alternating."""
import statistics, time, torch
from torch.func import functional_call
from stage0 import Stage
from tessel.bench.stats import paired_ratio

st = Stage("transformer")
x0, g0 = st.xs[0], st.gs[0]
st.net(x0).backward(g0); st.opt.step()  # a momentum buffer to predict with
sw, params = st.sw, st.params


def module():
    x = x0.clone().requires_grad_(True)
    torch.autograd.backward(st.net(x), g0)


def predicted():
    x = x0.clone().requires_grad_(True)
    weights, leaves, ctx, _ = sw.make(1)
    with ctx:
        out = functional_call(st.net, weights, (x,))
    del weights
    torch.autograd.backward(out, g0)
    for n, leaf in leaves.items():
        p = params[n]
        p.grad = leaf.grad if p.grad is None else p.grad.add_(leaf.grad)


fns = {"module": module, "predicted": predicted}
res = {k: [] for k in fns}
for rd in range(10):
    for k in (list(fns) if rd % 2 == 0 else list(fns)[::-1]):
        fns[k]()
        c = time.thread_time()
        for _ in range(10):
            fns[k]()
        res[k].append((time.thread_time() - c) / 10 * 1e3)
for k, v in res.items():
    print(k, round(statistics.median(v), 2), "ms")
print("predicted over module", paired_ratio(dict(enumerate(res["predicted"])), dict(enumerate(res["module"]))))
