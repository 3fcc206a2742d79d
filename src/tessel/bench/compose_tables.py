"""The compose scenario's own table: composed plans against DDP and the best single axes, cell by cell."""

from __future__ import annotations

import re
from typing import Any

from ..train.metrics import human_bytes
from .cells import against, cell, versus
from .scenarios import Scenario


def axes(strategy: str) -> set[str]:
    """The parallel axes a strategy's name sets: 'dp2-pp2-tp2-1d' -> dp, pp, tp; 'tp8-3d' -> tp; 'ddp' -> none."""
    return set(re.findall(r"\b(dp|pp|tp)\d", strategy))


def _ms(r: dict[str, Any]) -> str:
    s = r["step_time"]
    return f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.1f}–{s['max'] * 1e3:.1f})"


def _channels(sent: dict[str, float], top: int = 3) -> str:
    """The ``top`` busiest channels, largest first, as 'channel size' pairs."""
    busiest = sorted(((v, c) for c, v in sent.items() if v), key=lambda vc: (-vc[0], vc[1]))[:top]
    return ", ".join(f"{c} {human_bytes(v)}" for v, c in busiest) or "–"


def compose_table(rows: list[dict[str, Any]], scn: Scenario) -> str:
    """Step time, bytes, parameter+optimizer memory and bound per strategy and cell; a verdict per cell."""
    if scn.name != "compose":
        return ""
    order = list(scn.strategies)
    mine = sorted((r for r in rows if r["strategy"] in order),
                  key=lambda r: (r["model"], r["hosts"], r["rate"], order.index(r["strategy"])))
    if not mine:
        return ""
    lines = ["", "Composed plans against DDP in the same cell: step time (median over repeats, min–max across "
             "repeats) and DDP's over it, paired by round (95% interval); bytes each rank sends per step on its "
             "busiest channels; parameters + optimizer state per rank (largest rank) and its ratio to DDP's "
             "(the target for pp2-tp4: at most "
             "1/6 = 0.167); comm bound = busiest rank's bytes per step over the link rate.", "",
             "| hosts | link | strategy | step ms: median (min–max) | vs ddp | bytes/step, busiest channels "
             "| params+opt/rank | vs ddp | comm bound ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in mine:
        ddp = cell(rows, r, "ddp")
        mem, ddp_mem = r.get("state_mem"), (ddp or {}).get("state_mem")
        lines.append("| " + " | ".join([
            str(r["hosts"]), r["rate"], r["strategy"], _ms(r),
            versus(rows, r, "ddp"),
            _channels(r["bytes_per_step"]),
            human_bytes(mem) if mem else "–",
            f"{mem / ddp_mem:.3f}" if mem and ddp_mem else "–",
            f"{r['comm_bound'] * 1e3:.1f}" if r["comm_bound"] else "–",
        ]) + " |")
    lines.append("")
    for key in dict.fromkeys((r["model"], r["hosts"], r["rate"]) for r in mine):
        lines.append(verdict([r for r in mine if (r["model"], r["hosts"], r["rate"]) == key]))
    return "\n".join(lines) + "\n"


def _noise(rows: list[dict[str, Any]], r: dict[str, Any], worst: dict[str, Any]) -> bool:
    """r is slower than worst only by noise: the paired interval of worst's time over r's includes 1."""
    ratio = against(rows, r, worst["strategy"])
    return ratio is None or ratio.verdict() != "below"


def verdict(rows: list[dict[str, Any]]) -> str:
    """One sentence on one cell: the fastest strategy, and any composed plan slower than every single axis."""
    med = lambda r: r["step_time"]["median"]  # noqa: E731
    best = min(rows, key=med)
    kind = "a composed plan" if len(axes(best["strategy"])) >= 2 else "not a composed plan"
    text = (f"At {rows[0]['rate']} on {rows[0]['hosts']} hosts the fastest is `{best['strategy']}` "
            f"({med(best) * 1e3:.1f} ms), {kind}")
    single = [r for r in rows if len(axes(r["strategy"])) == 1]
    composed = [r for r in rows if len(axes(r["strategy"])) >= 2]
    if single and composed:
        worst = max(single, key=med)
        slower = [r for r in composed if med(r) > med(worst)]
        # slower only by noise where the paired interval of worst's time over its own includes 1
        named = [f"`{r['strategy']}` ({med(r) * 1e3:.1f} ms{', within noise' if _noise(rows, r, worst) else ''})"
                 for r in slower]
        if named:
            text += (f"; slower than the slowest single axis (`{worst['strategy']}`, {med(worst) * 1e3:.1f} ms): "
                     + ", ".join(named))
        else:
            text += f"; no composed plan is slower than the slowest single axis (`{worst['strategy']}`)"
    return text + "."
