import json, sys
from tessel.cluster.emulate import EmulatedCluster
import torch, time
# idle, one process
sys.argv = ["x"]
for h in (4, 8):
    with EmulatedCluster(h, rate="1gbit", prefix="tsop", cpus=2 / h) as emu:
        res = emu.run(emu.torchrun_commands(["bench/plan-trial-3/optshare/optshare.py"], run_id="opt"), timeout=300)
    ranks = json.loads(res[0].stdout.strip().splitlines()[-1])
    for label in ("whole", "quarter"):
        w = [r[label]["wall_ms"] for r in ranks]; c = [r[label]["cpu_ms"] for r in ranks]
        print(f"{h} hosts {label}: wall ms {min(w):.1f}-{max(w):.1f}, cpu ms {min(c):.1f}-{max(c):.1f}")
