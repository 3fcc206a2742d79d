import time

from tessel.bench.plan_check import COMMON, MODELS
from tessel.config import load_config
from tessel.planner.profile import measure
from tessel.resolve import job_of

cfg = load_config(None, [*MODELS["lstm_lm"], *COMMON])
for i in range(4):
    t0 = time.perf_counter()
    p = measure(job_of(cfg), sizes=(4, 8, 16, 32), dps=(1, 2))
    print(f"profile {i} ({time.perf_counter() - t0:.1f} s): step_factor {p.step_factor:.3f};",
          {s: [round(layer.seconds(s) * 1e3, 2) for layer in p.layers] for s in (4, 8, 16, 32)}, flush=True)
