"""scripts/gpu_check.py in its CPU wiring mode (tiny shapes, gloo), so the GPU check cannot rot between the
occasions a CUDA machine is at hand: every part runs and says what it measured. The script itself runs its
speed part (a `tessel train` it launches) and its collectives (two ranks under torchrun); its parity part, the
same lines, runs here with its runs trained in the test worlds (tests/trained.py: two launches fewer, ~25 s)."""

import subprocess
import sys
from pathlib import Path

from trained import example, train

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu_check.py"


def test_gpu_check_wiring_runs_speed_and_collectives():
    r = subprocess.run([sys.executable, str(SCRIPT), "--wiring", "--parts", "speed,collectives"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert sum(ln.startswith("speed: ") and "tokens/s" in ln for ln in lines) == 2, r.stdout
    assert sum(ln.startswith("collectives: ") and ln.endswith(" ok") for ln in lines) == 5, r.stdout
    assert lines[-1] == "gpu_check: all parts ran, parity held"


def test_gpu_check_wiring_parity_holds_in_both_layouts(world1, world4, tmp_path, monkeypatch, capsys):
    check = example("gpu_check", folder="scripts")

    def launch_train(argv: list[str]) -> None:  # the script's runs, each on the world of its size
        train({1: world1, 4: world4}[check.config(argv).nproc], tmp_path, *argv)

    monkeypatch.setattr(check, "launch_train", launch_train)
    assert check.parity(True, tmp_path)
    parity = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("parity: ")]
    assert len(parity) == 2 and all(ln.endswith(" ok") for ln in parity), parity


def test_gpu_check_tells_gloos_cuda_send_abort_from_a_failure():
    """gloo aborts the process on CUDA tensors in send/recv, the last call tried; tessel.comm never sends CUDA
    tensors through it, so that abort alone passes the part, said as such, and any other failure does not."""
    check = example("gpu_check", folder="scripts")
    ok = "".join(f"collectives: gloo, cuda tensors, {name:18s} ok\n" for name in check.COLLECTIVES[:-1])
    said, good = check.collectives_verdict(ok, -6, "Signal 6 (SIGABRT) received")
    assert good and "send/recv" in said and "not supported" in said
    assert check.collectives_verdict(ok + "collectives: gloo, cuda tensors, send/recv ok\n", 0, "") == ("", True)
    wrong = ok.replace("broadcast          ok", "broadcast          wrong values")
    assert check.collectives_verdict(wrong, -6, "a\nb\nSignal 6") == ("collectives: failed: a | b | Signal 6", False)
    assert not check.collectives_verdict(ok.split("\n", 1)[1], -6, "x")[1]  # one call missing before the abort


def test_gpu_check_refuses_without_cuda():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--wiring" in r.stderr
