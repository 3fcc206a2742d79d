"""Local processes (no emulation): pp2 and pp4 GPipe m8 of the planner cells' Transformer, alternating, each
round with a fresh profile; per stage, CPU per step measured against the profile's price of its layers (speed 1)."""
import json, os, subprocess, sys, torch
from pathlib import Path
sys.path.insert(0, "/tmp/s33/prof")
from period import MODEL  # noqa
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.bench.plan_check import MODELS, COMMON
from tessel.planner.profile import measure
torch.set_num_threads(1)
SPLITS = {"pp2": "3,3", "pp4": "2,1,1,2"}
rounds, out = int(sys.argv[1]), Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
job = job_of(load_config(None, [*MODELS["transformer_lm"], *COMMON]))
for r in range(rounds):
    prof = measure(job)
    per = [l.seconds(4) * prof.step_factor for l in prof.layers]
    for name in (["pp2", "pp4"] if r % 2 == 0 else ["pp4", "pp2"]):
        d = out / f"r{r}-{name}"
        n = int(name[2:])
        subprocess.run([sys.executable, "-m", "tessel", "train", *MODEL, "--pp", str(n), "--pipeline.schedule", "gpipe",
                        "--micro-batches", "8", "--pipeline.split", SPLITS[name], "--nproc", str(n), "--out", str(d)],
                       check=True, capture_output=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        s = json.loads((d / "summary.json").read_text()); p = s["pipeline"]
        sizes = [int(k) for k in SPLITS[name].split(",")]
        bounds, lo = [], 0
        for k in sizes:
            bounds.append((lo, lo + k)); lo += k
        priced = [8 * sum(per[a:b]) for a, b in bounds]
        cpu = p["cpu_per_step_per_rank"]
        print(json.dumps({"round": r, "plan": name, "step_ms": round(s["median_step_time"] * 1e3, 1),
                          "cpu_ms": [round(c * 1e3, 1) for c in cpu], "priced_ms": [round(x * 1e3, 1) for x in priced],
                          "cpu/priced": [round(c / x, 2) for c, x in zip(cpu, priced)]}), flush=True)
