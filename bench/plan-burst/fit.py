"""The link's burst as the probe now measures it (tessel.planner.probe.link_burst: two big messages and a line
through them), alone: one line 'burst {"link_burst": bytes}' from rank 0, with a data-parallel job's mesh held as
the probe holds it. RATE_MBIT: the link's nominal rate, which sets the messages' sizes.
  RATE_MBIT=300 tessel cluster run --hosts 3 --rate 300mbit --cpus 0.667 --torchrun -- bench/plan-burst/fit.py"""
import json
import os

import torch
import torch.distributed as dist

from tessel import mesh
from tessel.planner import probe

dist.init_process_group("gloo")
torch.set_num_threads(1)
probe.hold_job_mesh()
burst = probe.link_burst(float(os.environ["RATE_MBIT"]))
if dist.get_rank() == 0:
    print("burst " + json.dumps({"link_burst": burst}), flush=True)
mesh.shutdown()
