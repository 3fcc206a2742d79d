"""scripts/gpu_check.py in its CPU wiring mode (tiny shapes, gloo), so the GPU check cannot rot between the
occasions a CUDA machine is at hand: every part runs and says what it measured. One parity case of the two: both
go through the same lines, and the suite's own parity tests cover each layout (two launches fewer, ~15 s)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu_check.py"


def test_gpu_check_wiring_runs_every_part():
    r = subprocess.run([sys.executable, str(SCRIPT), "--wiring", "--cases", "dp2-tp2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert sum(ln.startswith("speed: ") and "tokens/s" in ln for ln in lines) == 2, r.stdout
    assert sum(ln.startswith("collectives: ") and ln.endswith(" ok") for ln in lines) == 5, r.stdout
    parity = [ln for ln in lines if ln.startswith("parity: ")]
    assert len(parity) == 1 and all(ln.endswith(" ok") for ln in parity), r.stdout
    assert lines[-1] == "gpu_check: all parts ran, parity held"


def test_gpu_check_refuses_without_cuda():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--wiring" in r.stderr
