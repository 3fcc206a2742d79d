"""bf16-mixed against fp32 on one GPU: `tessel train` at GPT-2-small size (scripts/gpu_check.py's shape, 30 steps)
and with its defaults (200 steps), the two precisions in alternating order, ROUNDS rounds each; prints each run's
median tokens/s and the paired ratio. Run from the repository root on the GPU machine:

    PYTHONPATH=src python3 bench/gpu-2026-11-30/precision.py [ROUNDS]
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import torch  # noqa: E402
from gpu_check import GPT2_SMALL, TINY, tessel_train  # noqa: E402

from tessel.bench.stats import paired_ratio  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
CELLS = {"GPT-2 small, 30 steps": [*GPT2_SMALL, "--steps", "30"],
         "tessel train's defaults, 200 steps": ["--steps", "200"]}
BACKEND = "nccl"
if not torch.cuda.is_available():  # the wiring, on the CPU with tiny shapes
    CELLS, BACKEND = {"tiny, 4 steps": [*TINY, "--steps", "4"]}, "gloo"

with tempfile.TemporaryDirectory() as tmp:
    for c, (cell, flags) in enumerate(CELLS.items()):
        tps: dict[str, dict[int, float]] = {"fp32": {}, "bf16-mixed": {}}
        for r in range(ROUNDS):
            for precision in sorted(tps, reverse=bool(r % 2)):
                run = tessel_train(*flags, "--nproc", "1", "--parallel.backend", BACKEND, "--train.precision",
                                   precision, out=Path(tmp) / f"{c}-{precision}-{r}")
                if "error" in run:
                    print(f"{cell}: {precision} failed: {run['error']}", flush=True)
                    continue
                tps[precision][r] = run["median_tokens_per_s"]
                print(f"{cell}: round {r} {precision} {run['median_tokens_per_s']:.0f} tokens/s", flush=True)
        ratio = paired_ratio(tps["bf16-mixed"], tps["fp32"])
        said = f"{ratio.value:.2f}x ({ratio.low:.2f}-{ratio.high:.2f}), n={ratio.n}" if ratio else "none"
        print(f"{cell}: bf16-mixed over fp32, tokens/s paired by round: {said}", flush=True)
