import os, sys, gc, ctypes, torch, torch.distributed as dist
libc=ctypes.CDLL('libc.so.6')
TRIM=os.environ.get('TRIM')=='1'
from torch.distributed.device_mesh import init_device_mesh
from tessel.models.transformer_lm import TransformerLM
from tessel.fsdp import apply_fsdp
def hwm():
    for l in open('/proc/self/status'):
        if l.startswith('VmHWM'): return int(l.split()[1]) / 1024
def rss():
    for l in open('/proc/self/status'):
        if l.startswith('VmRSS'): return int(l.split()[1]) / 1024
def anon():
    for l in open('/proc/self/status'):
        if l.startswith('RssAnon'): return int(l.split()[1]) / 1024
torch.manual_seed(0)
dist.init_process_group('gloo'); r = dist.get_rank()
L = int(sys.argv[1]); shard = sys.argv[2] == 'fsdp'
mesh = init_device_mesh('cpu', (8,))
a0 = anon()
m = TransformerLM(512, 32, dim=256, layers=L, heads=8)
a1 = anon()
if shard:
    apply_fsdp(m, mesh, list(m.blocks))
else:
    m = torch.nn.parallel.DistributedDataParallel(m)
gc.collect(); a2 = anon()
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
x = torch.randint(0, 512, (2, 32))
pts = []
pk = []
for s in range(6):
    open('/proc/self/clear_refs','w').write('5'); r0 = rss()
    loss = m(x, x)
    loss = loss if loss.dim() == 0 else loss.mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); gc.collect()
    if TRIM: libc.malloc_trim(0)
    pts.append(round(anon() - a2, 1)); pk.append(round(hwm() - r0, 1))
params = sum(p.numel() for p in m.parameters())  # local
if r == 3: print(sys.argv[1:], f'built +{a1-a0:.1f} MiB, after wrap {a2-a0:+.1f}, per step over wrap {pts}, step peak over its start RSS {pk}, final RSS {rss():.0f}, local params {params*4/2**20:.1f} MiB (x4 with grads+adam: {params*16/2**20:.1f})', flush=True)
dist.barrier(); dist.destroy_process_group()
