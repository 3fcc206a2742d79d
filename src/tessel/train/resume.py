"""Where a run starts: step 0, the checkpoint ``--resume`` names, or, after an elastic restart, this run's own
newest intact checkpoint.

torch's elastic agent restarts every worker with the same command line and ``TORCHELASTIC_RESTART_COUNT``
raised by one; the restarted workers continue without ``--resume``. A fresh run writes a ``run`` file with a
new id into the checkpoint folder and every checkpoint it saves carries that id, so a restart before this
run's first checkpoint starts over instead of picking up an older run's checkpoint from the same folder::

    start = find_start(Path("runs/latest/checkpoints"), resume=False, restarted=True)
    start.path, start.run, start.skipped      # None or a checkpoint, the run id, [(path, why), ...]
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError
from .integrity import newest_intact

RUN_FILE = "run"


def restart_count() -> int:
    """How many times the elastic agent has restarted this job's workers (0 on the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


@dataclass
class Start:
    path: str | None  # checkpoint to load, or None: step 0
    run: str  # id every checkpoint of this run carries
    skipped: list[tuple[str, str]] = field(default_factory=list)  # damaged checkpoints passed over, and why

    def notes(self) -> list[str]:
        return [f"tessel: checkpoint '{p}' skipped (renamed to *.damaged): {why}" for p, why in self.skipped]


def _write_run(dir: Path, run: str) -> None:
    dir.mkdir(parents=True, exist_ok=True)
    tmp = dir / f"{RUN_FILE}.part"
    tmp.write_text(run)
    os.replace(tmp, dir / RUN_FILE)


def _this_run(meta: dict, run: str) -> str | None:
    return None if meta.get("run") == run else "written by an earlier run in the same folder"


def find_start(dir: Path, resume: bool, restarted: bool) -> Start:
    """Decide on one rank (it reads and hashes files) where training starts; see the module docstring."""
    if resume:  # the user's choice: the newest intact checkpoint of any run, whose id the run then keeps
        path, skipped = newest_intact(dir)
        if path is None:
            why = "; ".join(f"{p.name}: {w}" for p, w in skipped) or "there is none"
            raise CheckpointError(f"--resume: no intact checkpoint in '{dir}' ({why}); train without --resume first")
        run = json.loads((path / "tessel.json").read_text()).get("run") or uuid.uuid4().hex
        return Start(str(path), run, [(str(p), w) for p, w in skipped])
    if restarted and (dir / RUN_FILE).is_file():
        run = (dir / RUN_FILE).read_text().strip()
        path, skipped = newest_intact(dir, lambda meta: _this_run(meta, run))
        damaged = [(str(p), w) for p, w in skipped if not w.startswith("written by")]
        return Start(str(path) if path else None, run, damaged)
    run = uuid.uuid4().hex
    _write_run(dir, run)
    return Start(None, run)
