"""The estimate's per-stage slot pieces for the saved tp pipelines of one cell: a micro-batch's layers (wall, at the
cell's probed speed), its tp collectives (seconds, and how many ring steps of latency), against the run's CPU a
micro-batch over the speed. Usage: python slots.py FOLDER MODEL HOSTS RATE"""
import sys
from pathlib import Path

from cell import load

from tessel.cluster.emulate import parse_rate
from tessel.planner import Topology
from tessel.planner.estimate import _layer_seconds, _tp_traffic
from tessel.resolve import settings_of

folder, model, hosts, rate = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
cfg, rows, plans, profile = load(folder, model, hosts, rate)
b = cfg.train.global_batch
settings = settings_of(cfg)
for r in rows:
    plan = plans[r["plan"]]
    if plan.pp == 1 or plan.tp == 1:
        continue
    topo = Topology(ranks=hosts, hosts=hosts, link_mbit=parse_rate(rate) / 1e6, latency=r["latency"],
                    speed=r["speed"], rate_mbit=r["rate_mbit"], overlap=r["overlap"])
    m = plan.micro_batches
    samples = b / (plan.dp * m)
    layer = [t * profile.step_factor / topo.speed for t in _layer_seconds(plan, profile, samples)]
    out = []
    for lo, hi in plan.bounds:
        elems, _, s_tp = _tp_traffic(plan, profile, range(lo, hi), samples * profile.tokens_per_sample, topo,
                                  settings.wire_dtype.itemsize)
        out.append((round(sum(layer[lo:hi]) * 1e3, 1), round(s_tp * 1e3, 1), round(s_tp / topo.latency)))
    print(f"{r['plan']:42s} speed {topo.speed:.3f} latency {topo.latency * 1e3:.2f} ms; per stage (layers ms, tp ms,"
          f" ~latencies): {out}; predicted {r['predicted'] * 1e3:.0f} ran {r['measured'] * 1e3:.0f}")
