"""block 1 of the planner cells' Transformer alone in one process, as pipeline stage 1 runs it (GPipe m8 of 4
samples: 8 forwards from fresh inputs that require grad, then 8 backwards from given gradients, then SGD),
against the profile's price of it; CPU ms per step, median of 20 after 3."""
import statistics, time, torch
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.bench.plan_check import MODELS, COMMON
from tessel.planner.profile import measure
torch.set_num_threads(1)
job = job_of(load_config(None, [*MODELS["transformer_lm"], *COMMON]))
import sys
price = float('nan')
block = job.build().blocks[1]
opt = torch.optim.SGD(block.parameters(), lr=0.01)
for order in ("gpipe",):
    ts = []
    for step in range(23):
        xs = [torch.randn(4, 32, 128, requires_grad=True) for _ in range(8)]
        gs = [torch.randn(4, 32, 128) for _ in range(8)]
        c = time.process_time()
        if order == "gpipe":
            outs = [block(x) for x in xs]
            for o, g in zip(outs, gs):
                o.backward(g)
        else:
            for x, g in zip(xs, gs):
                block(x).backward(g)
        opt.step(); opt.zero_grad()
        ts.append(time.thread_time() - c)
    print(f"round {sys.argv[1]} alone block1 cpu_ms {statistics.median(ts[3:])*1e3:.1f}")
