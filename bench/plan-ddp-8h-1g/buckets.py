import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.bench.plan_check import MODELS, COMMON
from tessel.parallelize import auto_bucket_mb
dist.init_process_group("gloo")
for name, ov in MODELS.items():
    cfg = load_config(None, [*ov, *COMMON]); job = job_of(cfg)
    m = job.build(); mb = float(os.environ.get("MB", 0)) or auto_bucket_mb(m)
    calls = []
    def hook(state, bucket):
        calls.append(bucket.buffer().numel() * 4)
        fut = torch.futures.Future(); fut.set_result(bucket.buffer()); return fut
    d = DDP(m, bucket_cap_mb=mb, gradient_as_bucket_view=True); d.register_comm_hook(None, hook)
    for it in range(3):
        calls.clear(); x = job.batch(8, 1); out = d(*x); loss = out if out.dim() == 0 else out.float().mean(); loss.backward()
    total = sum(p.numel()*4 for p in m.parameters())
    if dist.get_rank() == 0: print(name, "bucket_mb", mb, "total MB", round(total/2**20, 2), "buckets", len(calls), [round(c/2**20, 2) for c in calls])
