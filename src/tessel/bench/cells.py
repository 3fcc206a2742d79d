"""Helpers the report's tables share: the row of another strategy in the same cell, and a ratio against it."""

from __future__ import annotations

from typing import Any

from .stats import Ratio, paired_ratio


def cell(rows: list[dict[str, Any]], r: dict[str, Any], strategy: str) -> dict[str, Any] | None:
    """The row of ``strategy`` with the same model, hosts and link as row ``r``."""
    return next((x for x in rows if (x["model"], x["hosts"], x["rate"], x["strategy"]) ==
                 (r["model"], r["hosts"], r["rate"], strategy)), None)


def against(rows: list[dict[str, Any]], r: dict[str, Any], strategy: str) -> Ratio | None:
    """``strategy``'s step time over row ``r``'s in the same cell (above 1: ``r`` is faster), paired by round."""
    other = cell(rows, r, strategy)
    return paired_ratio(other["rounds"], r["rounds"]) if other else None


def versus(rows: list[dict[str, Any]], r: dict[str, Any], strategy: str) -> str:
    """``against`` as table text, e.g. '1.23x (1.10–1.38)'; '–' where the cell has no such strategy."""
    ratio = against(rows, r, strategy)
    return ratio.text() if ratio else "–"
