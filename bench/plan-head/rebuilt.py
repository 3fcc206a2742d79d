"""Pricing tried and not kept, judged on every cell: bench/plan-head/reprice.py run on tessel.planner.estimate with
whole lines of its source swapped for this process only (the package is not changed). Used by
bench/fsdp-quarter/reprice_tried.py and bench/pptp-slow/reprice_tried.py."""
import runpy
import sys
from pathlib import Path

import tessel.planner.estimate as est

BENCH = Path(__file__).resolve().parents[1]
# the cached profiles and fitted link bursts reprice-head6.txt was priced with
ARGS = ["--profiles", "/tmp/pg-head5.pkl", "--burst", str(BENCH / "plan-burst" / "fit.jsonl"), "--head6"]


def rebuild(swaps: list[tuple[str, str]], **names) -> None:
    """Swap each (old, new) whole line of the estimate's source, each found exactly once, and run it in the module's
    place; ``names`` are set in its namespace for the new lines to use."""
    src = Path(est.__file__).read_text()
    for old, new in swaps:
        if src.count(old) != 1:
            raise SystemExit(f"estimate.py no longer holds the line this rebuilds: {old.strip()[:60]}")
        src = src.replace(old, new)
    est.__dict__.update(names)
    exec(compile(src, est.__file__, "exec"), est.__dict__)


def reprice() -> None:
    """bench/plan-head/reprice.py over the cells as reprice-head6.txt priced them, printing to stdout."""
    sys.argv = ["reprice.py", *ARGS]
    runpy.run_path(str(BENCH / "plan-head" / "reprice.py"), run_name="__main__")
