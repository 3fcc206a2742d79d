"""Saved cells priced two ways by today's estimate (the probe's wait, quota and FSDP rates: the last way of
bench/plan-wait/reprice_probed.py) on one profile per (folder, model, hosts): with each layer's recompute share as
timed at the global batch only (as the profile took it before 2026-12-07's third session), and at the candidate's
micro-batch (timed at the smallest and the largest profiled size, the added seconds on the line between:
LayerProfile.again_at). The profiles are made afresh by today's code (they hold both sizes' shares) and cached at
--profiles; the first way prices with a copy whose shares keep the global batch's only.

    python bench/plan-recompute/reprice_sizes.py --profiles /tmp/pg-sizes.pkl bench/plan-latency-4h-200 \
        bench/plan-tail-4h-1g bench/plan-tail-6h-200 bench/plan-tail-8h-1g bench/plan-tail-8h-200 \
        bench/plan-mesh-4h-200 bench/plan-mesh-6h-1g bench/plan-mesh-8h-1g bench/plan-mesh-8h-200 \
        bench/plan-wait-8h-500 bench/plan-wait-6h-400 bench/plan-fsdp-4h-500 > bench/plan-recompute/reprice_sizes.txt
"""
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-probe-groups"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-wait"))
from held import price, report, save_profiles, summary  # noqa: E402
from reprice_probed import probed_ways, setup  # noqa: E402

WAYS = ("share at the global batch", "share at the micro-batch")


def at_global_batch(profile):
    """A copy of ``profile`` whose layers' recompute shares keep only the largest size's (the global batch's)."""
    flat = copy.copy(profile)
    flat.layers = [copy.copy(layer) for layer in profile.layers]
    for layer in flat.layers:
        layer.again = {k: {max(at): at[max(at)]} for k, at in layer.again.items()}
    return flat


def paired(variant, ways: tuple[str, str]) -> None:
    """Price the command line's folders on each cell's profile made afresh and on ``variant(profile)`` (the first
    of ``ways``), at today's topology (the probe's wait, quota and FSDP rates); print the report and the goals met."""
    args, points, latencies, profiles = setup()
    met = {w: [0] * 5 for w in ways}
    ncells = 0

    def today(r, topo):
        probed = probed_ways(r, topo, points)
        return probed and probed[-1:]
    for name in args.folders:
        new = price(Path(name), profiles, today, latencies)  # makes and caches the folder's profiles
        old = price(Path(name), {k: variant(p) for k, p in profiles.items()}, today, latencies)
        cells = {cell: [(r, [was[0], got[0]]) for (r, got), (_, was) in zip(rows, old[cell])]
                 for cell, rows in new.items()}
        ncells += report(name, cells, ways, met)
    for way, n in met.items():
        print(summary(way, n, ncells))
    save_profiles(Path(args.profiles), profiles)


if __name__ == "__main__":
    paired(at_global_batch, WAYS)
