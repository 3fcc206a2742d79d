"""block 1 of the planner cells' Transformer alone in one process, as pipeline stage 1 runs it (GPipe m8 of 4
samples: 8 forwards from fresh inputs that require grad, then 8 backwards from given gradients, then SGD); CPU ms
per step, median of 20 after 3. Without an argument: thread CPU in GPipe and interleaved order against the
profile's price of it. With a round number (rounds3.sh): process CPU in GPipe order, as the pipeline's
cpu_per_step counts it, no profile."""
import statistics, sys, time, torch
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.bench.plan_check import MODELS, COMMON
from tessel.planner.profile import measure
torch.set_num_threads(1)
job = job_of(load_config(None, [*MODELS["transformer_lm"], *COMMON]))
paired = len(sys.argv) > 1
if not paired:
    prof = measure(job)
    price = 8 * prof.layers[2].seconds(4) * prof.step_factor
clock = time.process_time if paired else time.thread_time
block = job.build().blocks[1]
opt = torch.optim.SGD(block.parameters(), lr=0.01)
for order in ("gpipe",) if paired else ("gpipe", "interleaved", "gpipe"):
    ts = []
    for step in range(23):
        xs = [torch.randn(4, 32, 128, requires_grad=True) for _ in range(8)]
        gs = [torch.randn(4, 32, 128) for _ in range(8)]
        c = clock()
        if order == "gpipe":
            outs = [block(x) for x in xs]
            for o, g in zip(outs, gs):
                o.backward(g)
        else:
            for x, g in zip(xs, gs):
                block(x).backward(g)
        opt.step(); opt.zero_grad()
        ts.append(clock() - c)
    if paired:
        print(f"round {sys.argv[1]} alone block1 cpu_ms {statistics.median(ts[3:])*1e3:.1f}")
    else:
        print(f"{order:12s} block 1 alone {statistics.median(ts[3:])*1e3:6.1f} ms CPU a step; profile's price {price*1e3:5.1f}")
