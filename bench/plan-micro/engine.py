"""A one-process step of each of `tessel bench plan`'s models (tessel's Engine, as the profile's real step) in 1, 2, 4,
8 and 16 micro-batches of the global batch, against its layers timed at that micro-batch times the count; 7 rounds
in alternating order, medians; "beyond" is the step's time beyond the layers at the 1-micro-batch step's ratio (the
optimizer scaled with the layers, which Profile.per_micro does not), per micro-batch beyond the first (ms of a
core). (Before 2026-12-07's third session's review it divided by all the micro-batches.)

    python bench/plan-micro/engine.py transformer_lm lstm_lm classifier > bench/plan-micro/engine.txt
"""
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common

from reprice_common import built  # noqa: E402

from tessel.chain import Runner, chain_of
from tessel.planner.profile import profile
from tessel.train.engine import Engine
from tessel.train.optim import build_optimizer
from tessel.train.tail import StepTail

COUNTS = (1, 2, 4, 8, 16)
for name in sys.argv[1:]:
    job, model, chain, x, y = built(name)
    s = job.settings
    b = s.global_batch
    engines = {}
    for m in COUNTS:
        copied = copy.deepcopy(model)
        runner = Runner(copied, chain_of(copied))
        params = list(runner.parameters())
        engines[m] = Engine(runner, StepTail(params, build_optimizer(params, s), s.clip), m, s.lr_at)
        engines[m].step(x, y, 0)
    steps, layers = {m: [] for m in COUNTS}, {m: [] for m in COUNTS}
    for r in range(7):
        for m in COUNTS if r % 2 == 0 else COUNTS[::-1]:
            t0 = time.thread_time()
            engines[m].step(x, y, r + 1)
            steps[m].append(time.thread_time() - t0)
            runs = profile(model, chain, x[:b // m], y[:b // m], repeats=1, reuse=True, warm=r == 0)
            layers[m].append(m * sum(c.seconds for c in runs))
    ratio = statistics.median(steps[1]) / statistics.median(layers[1])
    for m in COUNTS:
        step, lay = statistics.median(steps[m]), statistics.median(layers[m])
        print(f"{name} m{m:2d}: step {step * 1e3:6.1f} ms, layers x m {lay * 1e3:6.1f} ms, ratio {step / lay:.2f}, "
              f"beyond, per micro-batch beyond the first {(step - ratio * lay) / max(m - 1, 1) * 1e3:.2f} ms",
              flush=True)
