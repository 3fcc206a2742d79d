"""One FSDP run for bench/fsdp-prefetch: bench/plan-latency/where.py (each step's wall and its calls' time), each
step's bytes a channel printed as well ("bytes {...}"), and with PREFETCH=torch tessel.fsdp's backward prefetch
lists left unset, so torch's own default runs (the extra gather a step on a pipeline stage before the last)."""
import json
import os
import runpy
import sys
from pathlib import Path

from tessel import comm, fsdp

if os.environ.get("PREFETCH") == "torch":
    fsdp._prefetch_in_chain_order = lambda model, units: None
real_end = comm.counter.end_step


def end_step():
    out = real_end()
    sent = {c: v["sent"] for c, v in out.items()}
    print("bytes " + json.dumps({"rank": int(os.environ.get("RANK", 0)), "sent": sent}), flush=True)
    return out


comm.counter.end_step = end_step
sys.argv[0] = str(Path(__file__).resolve().parents[1] / "plan-latency" / "where.py")
sys.path.insert(0, str(Path(sys.argv[0]).parent))  # (where.py imports its folder's tcpstat)
runpy.run_path(sys.argv[0], run_name="__main__")
