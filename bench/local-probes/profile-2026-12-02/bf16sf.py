import sys

from tessel.bench.plan_check import COMMON, MODELS
from tessel.config import load_config
from tessel.planner.profile import measure
from tessel.resolve import job_of

for prec in ("fp32", "bf16-mixed", "fp32", "bf16-mixed"):
    cfg = load_config(None, [*MODELS["transformer_lm"], *COMMON, f"train.precision={prec}"])
    p = measure(job_of(cfg), sizes=(4, 32), dps=(1,))
    layers = round(sum(layer.seconds(32) for layer in p.layers) * 1e3, 1)
    print(sys.argv[1], prec, "step_factor", round(p.step_factor, 3), "layers at 32 (ms)", layers, flush=True)
