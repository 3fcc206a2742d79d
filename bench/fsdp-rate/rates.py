"""FSDP's rates as the planner's probe now times them (tessel.planner.probe.fsdp_rates: FSDP's order, back to
back), alone: one JSON line {"fsdp": [[group size, gather Mbit/s, reduce-scatter Mbit/s], ...]} from rank 0, with a
data-parallel job's mesh held as the probe holds it.
  tessel cluster run --hosts 6 --rate 300mbit --cpus 0.333 --torchrun -- bench/fsdp-rate/rates.py"""
import json

import torch
import torch.distributed as dist

from tessel import mesh
from tessel.planner import probe

dist.init_process_group("gloo")
torch.set_num_threads(1)
probe.hold_job_mesh()
rates = probe.fsdp_rates(torch.randn(64, 512), torch.randn(512, 512))  # (beside_trial's compute burst)
if dist.get_rank() == 0:
    print("fsdp " + json.dumps({"fsdp": rates}), flush=True)
mesh.shutdown()
