"""What machine a bench ran on, beyond torch's and Python's versions: facts a result turns on that differ between
sandboxes of the same kind."""

import platform
from pathlib import Path
from typing import Any


def cpu() -> dict[str, Any]:
    """The CPU's model and whether it has bf16 arithmetic (avx512_bf16 or AMX): bf16-mixed's speed on CPU turns on
    it (docs/benchmarks.md, mixed precision), and sandboxes of the same kind have differed in it."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or None, "bf16": None}
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return {"model": model, "bf16": bool(flags & {"avx512_bf16", "amx_bf16"})}
