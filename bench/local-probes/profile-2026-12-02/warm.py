import sys
import time

from tessel.bench.plan_check import COMMON, MODELS
from tessel.config import load_config
from tessel.planner.profile import measure
from tessel.resolve import job_of

for model in sys.argv[1:]:
    cfg = load_config(None, [*MODELS[model], *COMMON])
    t0 = time.perf_counter()
    p = measure(job_of(cfg), sizes=(4, 8, 16, 32), dps=(1, 2))
    print(f"{model} ({time.perf_counter() - t0:.1f} s): step_factor {p.step_factor:.3f};",
          {s: [round(layer.seconds(s) * 1e3, 2) for layer in p.layers] for s in (4, 32)}, flush=True)
