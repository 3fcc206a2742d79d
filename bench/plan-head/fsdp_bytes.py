"""FSDP's bytes in a saved `tessel bench plan` run: for each FSDP candidate, the busiest rank's dp.gather, dp.scatter
and dp.replicate bytes a step as the estimate predicts them (on a profile taken now) and as tessel.comm counted them
in its first round's summary (runs/ is not kept in git; these runs' first-round summaries are, added by force). The
plan check compared only dp.dense, pp and tp.* until this was run.

    python bench/plan-head/fsdp_bytes.py bench/plan-head-2h-100 > bench/plan-head/fsdp_bytes.txt
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for reprice_common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan-probe-groups"))

from held import topology  # noqa: E402
from reprice_common import measured_rows, plan_of  # noqa: E402

from tessel.bench import plan_check as pc  # noqa: E402
from tessel.config import load_config  # noqa: E402
from tessel.planner import choose  # noqa: E402
from tessel.planner.estimate import estimate  # noqa: E402
from tessel.resolve import job_of, settings_of  # noqa: E402

CHANNELS = ("dp.gather", "dp.scatter", "dp.replicate")
profiles = {}
for folder in map(Path, sys.argv[1:]):
    for r in measured_rows(folder):
        if "fsdp" not in r["plan"]:
            continue
        cfg = load_config(None, [*pc.MODELS[r["model"]], *pc.COMMON])
        topo = topology(r, None)
        if r["model"] not in profiles:
            profiles[r["model"]] = choose(job_of(cfg), topo, cfg.plan.allow_async).profile
        e = estimate(plan_of(folder, r, cfg), settings_of(cfg), profiles[r["model"]], topo)
        label = r["plan"].replace(" ", "-")
        runs = folder / f"{r['model']}-h{r['hosts']}-{r['rate']}" / "runs"
        run = sorted(runs.glob(f"{r['model']}-{label}-h*-r*"))[0]
        s = json.loads((run / "summary.json").read_text())
        counted = {c: v["sent_max_rank_total"] / max(s["steps_run"], 1) for c, v in s["bytes"].items()}
        for c in CHANNELS:
            if c in e.bytes or c in counted:
                print(f"{folder.name} {r['model']} h{r['hosts']} {r['rate']} {r['plan']}: {c} predicted "
                      f"{e.bytes.get(c, 0):.0f}, counted {counted.get(c, 0):.0f}")
