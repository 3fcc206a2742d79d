import json
from tessel.config import load_config
from tessel.planner import Topology
from tessel.planner.choose import choose
from tessel.planner.estimate import estimate
from tessel.resolve import job_of, settings_of
from tessel.choices import schedule, recompute
from tessel.bench.plan_check import MODELS, COMMON
cfg = load_config(None, [*MODELS["lstm_lm"], *COMMON])
topo = Topology(ranks=2, hosts=1, link_mbit=8000, speed=1.0)
planned = choose(job_of(cfg), topo, True)
pp2 = next(e.plan for e in planned.ranked if e.plan.pp == 2 and e.plan.dp == 1).with_(recompute=recompute("none"))
dp2 = next(e.plan for e in planned.ranked if e.plan.pp == 1 and e.plan.dp == 2)
print("bounds", pp2.bounds)
s = settings_of(cfg)
for name, p in [("dp2 m1", dp2), ("dp2 m4", dp2.with_(micro_batches=4)),
                ("pp2 gpipe m1", pp2.with_(schedule=schedule("gpipe"), micro_batches=1)),
                ("pp2 gpipe m4", pp2.with_(schedule=schedule("gpipe"), micro_batches=4)),
                ("pp2 gpipe m8", pp2.with_(schedule=schedule("gpipe"), micro_batches=8)),
                ("pp2 1f1b m8", pp2.with_(schedule=schedule("1f1b"), micro_batches=8))]:
    e = estimate(p, s, planned.profile, topo)
    print(f"{name:14s} step {e.step*1e3:6.1f}  compute {e.compute*1e3:6.1f}  bubble {e.bubble*1e3:6.1f} comm {e.comm*1e3:5.1f}")
json.dump({"bounds": pp2.bounds}, open("/tmp/grp/bounds.json", "w"))
prof = planned.profile
print("step_factor", prof.step_factor, "opt/elem", prof.optimizer_per_elem)
for l in prof.layers:
    print(l.name, {k: round(v*1e3,2) for k,v in l.measured.items()}, "at4", round(l.seconds(4)*1e3,2), "at32", round(l.seconds(32)*1e3,2), "params", l.params)
