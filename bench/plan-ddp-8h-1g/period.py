"""step_cpu.py on 8 hosts of 0.25 core at 1 Gbit/s, with the hosts' CPU quota granted per CFS period of 4, 10 (the
emulator's default) and 40 ms in turn: if the wall a DDP step spends beyond its compute and its all-reduces, each
measured apart, is hosts waiting out a throttled period (a ring step stalls while a neighbour has spent its quota),
it grows with the period. Run as root: python bench/plan-ddp-8h-1g/period.py"""
import pathlib
import sys

from tessel.cluster.emulate import EmulatedCluster

here = pathlib.Path(__file__).parent
for period_ms in (4, 10, 40, 4, 10, 40):
    with EmulatedCluster(8, "1gbit", cpus=0.25, period_us=period_ms * 1000, prefix="tslp") as c:
        out = c.run(c.torchrun_commands([str(here / "step_cpu.py")]), timeout=600)
    print(f"period {period_ms} ms:", "".join(r.stdout for r in out).strip().replace("\n", "\n  "), flush=True)
    sys.stdout.flush()
