import os, sys, torch, torch.distributed as dist
def st(k):
    for l in open('/proc/self/status'):
        if l.startswith(k): return int(l.split()[1]) / 1024
def reset():
    open('/proc/self/clear_refs','w').write('5')  # reset VmHWM
dist.init_process_group('gloo')
r, w = dist.get_rank(), dist.get_world_size()
N = 790_000 // w * w   # one block of the bench model, fp32: 3.0 MiB
s = torch.randn(N // w); full = torch.randn(N); o = torch.empty_like(s)
for op in ['ag', 'rs', 'ag', 'rs']:
    dist.barrier(); reset(); base = st('VmRSS')
    if op == 'ag': dist.all_gather_into_tensor(full, s)
    else: dist.reduce_scatter_tensor(o, full)
    hwm = st('VmHWM')
    if r == 3: print(op, f'transient over RSS {hwm-base:.2f} MiB; full {N*4/2**20:.2f} MiB', flush=True)
dist.barrier(); dist.destroy_process_group()
