"""Helpers the report's tables share: finding the row of another strategy in the same cell."""

from __future__ import annotations

from typing import Any


def cell(rows: list[dict[str, Any]], r: dict[str, Any], strategy: str) -> dict[str, Any] | None:
    """The row of ``strategy`` with the same model, hosts and link as row ``r``."""
    return next((x for x in rows if (x["model"], x["hosts"], x["rate"], x["strategy"]) ==
                 (r["model"], r["hosts"], r["rate"], strategy)), None)
