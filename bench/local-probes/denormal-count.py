# One process, the planner cells' LSTM LM (lrun.sh's flags): 30 SGD steps on its data; at steps 1, 10 and 30 the
# share of subnormal float32 values among every op's outputs in forward and backward, and in the gradients.
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from tessel.config import load_config
from tessel.resolve import job_of
torch.set_num_threads(1)
cfg = load_config(None, ["model.name=lstm_lm", "model.dim=64", "model.hidden=256", "data.vocab_size=4096",
                         "data.seq_len=32", "train.global_batch=32", "train.optimizer=sgd", "train.lr=0.01"])
job = job_of(cfg)
torch.manual_seed(0)
model = job.build()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
tiny = torch.finfo(torch.float32).tiny
class Count(TorchDispatchMode):
    def __init__(s): super().__init__(); s.n = s.sub = 0; s.ops = {}
    def __torch_dispatch__(s, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel():
                k = int(((t != 0) & (t.abs() < tiny)).sum()); s.n += t.numel(); s.sub += k
                if k: s.ops[str(func)] = s.ops.get(str(func), 0) + k
        return out
for step in range(1, 31):
    x, y = job.batch(32, 1)
    c = Count()
    with c:
        loss = model(x, y); loss = loss.mean() if loss.dim() else loss
        loss.backward()
    g = [p.grad for p in model.parameters() if p.grad is not None]
    gs = sum(int(((t != 0) & (t.abs() < tiny)).sum()) for t in g); gn = sum(t.numel() for t in g)
    if step in (1, 10, 30):
        top = sorted(c.ops.items(), key=lambda kv: -kv[1])[:4]
        print(f"step {step}: loss {loss.item():.3f}; subnormal outputs {c.sub} of {c.n} ({c.sub / c.n:.2e}); in grads {gs} of {gn}; top ops {top}", flush=True)
    opt.step(); opt.zero_grad()
