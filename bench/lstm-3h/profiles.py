"""The planner's profile of the plan check's LSTM (tessel.planner.profile.measure at the sizes its 3-host candidates
use: 8, 16 and 32 samples), taken 5 times one after another: each layer's seconds (forward + backward, one thread)
at 16 and 32 samples, the step factor and the cost per micro-batch.

    python bench/lstm-3h/profiles.py"""
from tessel.bench import plan_check as pc
from tessel.config import load_config
from tessel.planner.profile import measure
from tessel.resolve import job_of

job = job_of(load_config(None, [*pc.MODELS["lstm_lm"], *pc.COMMON]))
for _ in range(5):
    p = measure(job, sizes=(8, 16, 32))
    at = {n: " ".join(f"{layer.name} {layer.seconds(n) * 1e3:.1f}" for layer in p.layers) for n in (16, 32)}
    print(f"16 samples: {at[16]} ms; 32: {at[32]} ms; step factor {p.step_factor:.3f}, per_micro "
          f"{p.per_micro * 1e3:.2f} ms", flush=True)
