"""Saved cells priced two ways by today's estimate (the probe's wait, quota and FSDP rates) on one profile per
(folder, model, hosts), made afresh: without the runtime's cost per micro-batch (Profile.per_micro at 0, as the
estimate priced a plan without a calibration trial before 2026-12-07's third session) and with the profile's. Each
profile's per_micro is printed last. `reprice_micro-4.txt` is commit 9000c97's output, the step timed in up to 4
micro-batches; `reprice_micro.txt` this one's, in up to 16.

    python bench/plan-micro/reprice_micro.py --profiles /tmp/pg-micro.pkl bench/plan-latency-4h-200 \
        bench/plan-tail-4h-1g bench/plan-tail-6h-200 bench/plan-tail-8h-1g bench/plan-tail-8h-200 \
        bench/plan-mesh-4h-200 bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g bench/plan-mesh-8h-200 \
        bench/plan-wait-8h-500 bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 > bench/plan-micro/reprice_micro.txt
"""
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-recompute"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-probe-groups"))
from held import load_profiles  # noqa: E402
from reprice_sizes import paired  # noqa: E402

WAYS = ("without the runtime's cost", "with the profile's")


def without(profile):
    """A copy of ``profile`` that prices no cost per micro-batch beyond the layers."""
    out = copy.copy(profile)
    out.per_micro = 0.0
    return out


if __name__ == "__main__":
    paired(without, WAYS)
    cache = Path(sys.argv[sys.argv.index("--profiles") + 1])
    for key, profile in sorted(load_profiles(cache).items()):
        print(f"{key}: per_micro {profile.per_micro * 1e3:.2f} ms of a core")
