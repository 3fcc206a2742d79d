"""pp4 GPipe m8 of the planner cells' Transformer: 4 emulated hosts (0.5 core quota each, 10 ms period, 1 Gbit/s)
against 4 local processes (no quota, no shaping), alternating; each run's median step and its stages' CPU per step."""
import json, subprocess, sys
from pathlib import Path
from tessel.cluster.emulate import EmulatedCluster
sys.path.insert(0, "/tmp/s33/prof")
from period import MODEL, PLANS  # noqa

rounds, out = int(sys.argv[1]), Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
for r in range(rounds):
    for where in (["hosts", "local"] if r % 2 == 0 else ["local", "hosts"]):
        d = out / f"r{r}-{where}"
        args = ["-m", "tessel", "train", *MODEL, *PLANS["pp4-gpipe-m8"], "--out", str(d.resolve())]
        if where == "hosts":
            with EmulatedCluster(4, "1gbit", cpus=0.5, prefix="tsinf") as c:
                c.run(c.torchrun_commands(args), timeout=600)
        else:
            subprocess.run([sys.executable, *args, "--nproc", "4"], check=True, capture_output=True, timeout=600,
                           env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        s = json.loads((d / "summary.json").read_text()); p = s["pipeline"]
        print(json.dumps({"round": r, "where": where, "step_ms": round(s["median_step_time"] * 1e3, 1),
                          "cpu_ms": [round(x * 1e3, 1) for x in p["cpu_per_step_per_rank"]]}), flush=True)
