"""Checksums that make a damaged checkpoint impossible to load unnoticed.

A save lists every file DCP wrote, with its size and SHA-256, in the checkpoint's ``tessel.json``, which is
written last (before the folder's atomic rename) and carries a checksum of its own text. ``problem`` redoes
the sums before any tensor is read; ``newest_intact`` walks a run's checkpoints newest first, skipping the
damaged ones and saying why::

    path, skipped = newest_intact("runs/latest/checkpoints")   # (Path or None, [(Path, reason), ...])

A flipped bit anywhere (a shard, DCP's ``.metadata``, tessel.json itself) or a truncated file is found; a
file added beside them is not read by anything and is ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

META = "tessel.json"
_SEAL = "meta_sha256"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digest_files(folder: Path) -> dict[str, dict[str, Any]]:
    """{file name: {"bytes", "sha256"}} for every file in ``folder`` but tessel.json."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != META}


def _text_sum(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != _SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def seal(meta: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``meta`` with the folder's file sums and a checksum over all of it (what tessel.json holds)."""
    meta = {**meta, "files": digest_files(folder)}
    return {**meta, _SEAL: _text_sum(meta)}


def problem(folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` must not be loaded, or None if every file is as it was written."""
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError) as e:
        return f"its {META} is missing or unreadable ({e.__class__.__name__})"
    if not isinstance(meta, dict) or "files" not in meta:
        return f"its {META} records no file checksums (not written by this tessel, or damaged)"
    if meta.get(_SEAL) != _text_sum(meta):
        return f"its {META} does not match its own checksum"
    for name, want in sorted(meta["files"].items()):
        path = folder / name
        if not path.is_file():
            return f"file {name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"file {name} has {size} bytes, {want['bytes']} were written (truncated or overwritten)"
        if _sha256(path) != want["sha256"]:
            return f"file {name} does not match its SHA-256 (changed on disk since it was written)"
    return None


def checkpoints(dir: str | Path) -> list[Path]:
    """A run's checkpoint folders, newest first (not ``*.tmp`` saves in progress, nor ``*.damaged`` ones)."""
    dir = Path(dir)
    if not dir.is_dir():
        return []
    return sorted((p for p in dir.glob("step-*") if p.is_dir() and p.name[5:].isdigit()), reverse=True)


def newest_intact(dir: str | Path, accept: Callable[[dict], str | None] = lambda meta: None
                  ) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint in ``dir`` that verifies and that ``accept`` (meta -> reason or None) takes,
    and every newer one skipped with its reason."""
    skipped = []
    for path in checkpoints(dir):
        why = problem(path) or accept(json.loads((path / META).read_text()))
        if why is None:
            return path, skipped
        skipped.append((path, why))
    return None, skipped


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to ``<name>.damaged``: kept for inspection, out of the way of resuming and
    of pruning (which would otherwise keep it and delete an intact older one)."""
    target = path.with_name(path.name + ".damaged")
    if target.exists():
        return target
    path.rename(target)
    return target
