from tessel.config import load_config
from tessel.planner import Topology
from tessel.planner.choose import choose
from tessel.planner.estimate import estimate
from tessel.resolve import job_of, settings_of
from tessel.choices import schedule
from tessel.bench.plan_check import MODELS, COMMON
cfg = load_config(None, [*MODELS["transformer_lm"], *COMMON])
topo = Topology(ranks=4, hosts=4, link_mbit=1000, speed=0.5)
planned = choose(job_of(cfg), topo, True)
s = settings_of(cfg)
pp = next(e.plan for e in planned.ranked if e.plan.pp == 4)
dp = next(e.plan for e in planned.ranked if e.plan.pp == 1 and e.plan.dp == 4 and e.plan.tp == 1 and e.plan.dp_shard == 1)
pp = pp.with_(schedule=schedule("gpipe"), micro_batches=8, bounds=((0, 2), (2, 3), (3, 4), (4, 6)))
for name, p in [("dp4 m1", dp.with_(micro_batches=1)), ("pp4 gpipe m8", pp)]:
    e = estimate(p, s, planned.profile, topo)
    print(f"{name:14s} step {e.step*1e3:6.1f} compute {e.compute*1e3:6.1f} bubble {e.bubble*1e3:6.1f} comm {e.comm*1e3:5.1f}", p.bounds)
print([ (l.name, round(l.seconds(4)*1e3,2)) for l in planned.profile.layers], planned.profile.step_factor)
