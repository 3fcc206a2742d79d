import time, torch, statistics, sys
from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.chain import Runner, chain_of
from tessel.train.engine import Engine
from tessel.train.optim import build_optimizer
from tessel.train.tail import StepTail
torch.set_num_threads(1)
cfg = load_config(None, [*pc.MODELS[sys.argv[1]], *pc.COMMON])
job = job_of(cfg); torch.manual_seed(0); model = job.build(); runner = Runner(model, chain_of(model))
tail = StepTail(list(runner.parameters()), build_optimizer(list(runner.parameters()), job.settings), job.settings.clip)
x, y = job.batch(job.settings.global_batch, 1); e = Engine(runner, tail, 1, job.settings.lr_at)
for s in range(3): e.step(x, y, s)
ts = []
for s in range(20):
    t0 = time.perf_counter(); e.step(x, y, s); ts.append(time.perf_counter() - t0)
print(f"{statistics.median(ts)*1e3:.2f}")
