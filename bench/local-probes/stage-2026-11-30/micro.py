"""One process, one thread: the planner's price of a step in 1 micro-batch of 32 and in 8 of 4 (a fresh profile)
against the CPU seconds the engine takes for each, alternating, median of 6 after a warm-up."""
import statistics, sys, time, torch
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.bench.plan_check import MODELS, COMMON
from tessel.planner.profile import measure
from tessel.planner.calibrate import predicted_step
from tessel.chain import Runner, chain_of
from tessel.train.engine import Engine
from tessel.train.optim import build_optimizer
from tessel.train.tail import StepTail
torch.set_num_threads(1)
model_name = sys.argv[1] if len(sys.argv) > 1 else "transformer_lm"
job = job_of(load_config(None, [*MODELS[model_name], *COMMON]))
prof = measure(job)
s = job.settings
torch.manual_seed(0)
model = job.build(); runner = Runner(model, chain_of(model))
tail = StepTail(list(runner.parameters()), build_optimizer(list(runner.parameters()), s), s.clip)
b = s.global_batch
res = {}
for m in (1, 2, 4, 8):
    x, y = job.batch(b, 1)
    res[m] = (Engine(runner, tail, m, s.lr_at), x, y, [])
for step in range(7):
    for m, (eng, x, y, ts) in res.items():
        t0 = time.thread_time(); eng.step(x, y, step).read(); ts.append(time.thread_time() - t0)
print(model_name, "step_factor", round(prof.step_factor, 3))
for m, (_, _, _, ts) in res.items():
    real, price = statistics.median(ts[1:]), predicted_step(prof, b // m, m)
    print(f"m{m}: real {real*1e3:7.1f} ms  priced {price*1e3:7.1f} ms  real/priced {real/price:5.2f}")
