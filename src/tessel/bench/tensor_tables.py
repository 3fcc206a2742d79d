"""The tensor scenario's own table: bytes per block against the formula, activation memory against 1-D."""

from __future__ import annotations

from typing import Any

from ..tensor.cost import projection_markdown
from ..train.metrics import human_bytes
from .cells import cell, versus

TORCH_PEERS = ("torch-1d", "torch-1d-sp")  # torch's parallelize_module without and with sequence parallelism


def tensor_table(rows: list[dict[str, Any]], projection: bool = True) -> str:
    """The table of tensor-parallel rows; ``projection``: followed by the cost model's 64-GPU projection (the
    tensor scenario's section carries it, not every section that has tp runs)."""
    tps = [r for r in rows if r.get("tensor")]
    if not tps:
        return ""
    lines = ["", "Tensor-parallel runs: torch's best native 1-D's (the faster of its plans without and with sequence "
             "parallelism in that cell, named) and tessel's 1-D's step time over the strategy's in the same cell, "
             "paired by round (95% interval); bytes "
             "each rank sends per Transformer block per step on channel `tp` (the blocks' linears), measured and "
             "from the formula in `tessel.tensor.layout` (torch's traffic is not counted); activation memory = "
             "bytes autograd keeps for backward after one forward (largest rank), and its ratio to tessel 1-D's.",
             "", "| hosts | link | strategy | grid | step ms | vs torch's best 1-D | vs tessel 1d "
             "| tp bytes/block measured | formula | error | activations/rank | vs 1d |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tps:
        # torch at its best: whichever of its two plans (with or without sequence parallelism) ran faster here
        torch_1d = min((c for c in (cell(rows, r, s) for s in TORCH_PEERS) if c),
                       key=lambda c: c["step_time"]["median"], default=None)
        one_d = cell(rows, r, "1d")
        ms = r["step_time"]["median"]
        f = r.get("tensor_formula") or {}
        layers = f.get("layers") or 1
        measured = r["bytes_per_step"].get("tp", {}) if r["strategy"] not in TORCH_PEERS else None
        measured = measured / layers if isinstance(measured, (int, float)) else None
        formula = f.get("tp_bytes_per_step", 0) / layers if f else None
        act, act_1d = r.get("act_mem"), (one_d or {}).get("act_mem")
        lines.append("| " + " | ".join([
            str(r["hosts"]), r["rate"], r["strategy"], r["tensor"].replace(" regather", "") if r["tensor"] else "–",
            f"{ms * 1e3:.1f}",
            f"{versus(rows, r, torch_1d['strategy'])} ({torch_1d['strategy']})" if torch_1d else "–",
            versus(rows, r, "1d") if one_d else "–",
            human_bytes(measured) if measured is not None else "not counted",
            human_bytes(formula) if formula else "–",
            f"{(measured - formula) / formula:+.1%}" if measured is not None and formula else "–",
            human_bytes(act) if act else "–",
            f"{act / act_1d:.3f}" if act and act_1d else "–",
        ]) + " |")
    if not projection:
        return "\n".join(lines) + "\n"
    return ("\n".join(lines) + "\n\nCost-model projection to 64 GPUs (computed by `tessel.tensor.cost`, not measured; "
            "assumptions in docs/tensor.md): one GPT-style block, hidden 8192, MLP 4x, sequences of 2048.\n\n"
            + projection_markdown(h=8192, seq=2048, batches=(1, 4, 16)))


def tensor_plot(rows: list[dict[str, Any]]):
    """Step time over hosts at each link rate, and activation memory per rank, per strategy; None if no tp runs."""
    import matplotlib.pyplot as plt

    tps = [r for r in rows if r.get("tensor")]
    if not tps:
        return None
    rates = sorted({r["rate"] for r in tps})
    strategies = list(dict.fromkeys(r["strategy"] for r in tps))
    fig, axes = plt.subplots(1, len(rates) + 1, figsize=(4.2 * (len(rates) + 1), 3.6))
    for ax, rate in zip(axes, rates):
        for st in strategies:
            pts = sorted((r["hosts"], r["step_time"]["median"] * 1e3) for r in tps
                         if r["strategy"] == st and r["rate"] == rate)
            ax.plot(*zip(*pts), marker="o", label=st)
        ax.set(title=f"step time, {rate}", xlabel="hosts (= tp ranks)", ylabel="ms")
        ax.set_xticks(sorted({r["hosts"] for r in tps}))
        ax.legend(fontsize=8)
    ax = axes[-1]
    hosts = sorted({r["hosts"] for r in tps})
    width = 0.8 / len(strategies)
    for k, st in enumerate(strategies):
        vals = [next((r["act_mem"] / 2**20 for r in tps
                      if r["strategy"] == st and r["hosts"] == h and r.get("act_mem")), 0) for h in hosts]
        ax.bar([i + k * width for i in range(len(hosts))], vals, width, label=st)
    ax.set_xticks([i + width * (len(strategies) - 1) / 2 for i in range(len(hosts))], [f"{h} hosts" for h in hosts])
    ax.set(title="activations kept for backward", ylabel="MiB per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
