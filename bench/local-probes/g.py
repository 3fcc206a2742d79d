import os, torch, torch.distributed as dist
def anon():
    for l in open('/proc/self/status'):
        if l.startswith(('RssAnon','RssFile','Threads')): yield l.split()[1]
dist.init_process_group('gloo')
r, w = dist.get_rank(), dist.get_world_size()
t = torch.ones(1024)
dist.all_reduce(t); dist.barrier()
base = list(anon())
out = [base]
groups=[]
for k in range(8):
    # a pair group and a group of 4 each round, like tp/dp subgroups
    g2 = [dist.new_group([i, i ^ 1]) for i in range(0, w, 2)]
    g4 = [dist.new_group(list(range(j, j + 4))) for j in range(0, w, 4)]
    mine = g2[r // 2]; mine4 = g4[r // 4]
    dist.all_reduce(torch.ones(1024), group=mine); dist.all_reduce(torch.ones(1024), group=mine4)
    groups += [g2, g4]
    dist.barrier()
    out.append(list(anon()))
if r == 0:
    for i, o in enumerate(out): print(i * 2, 'groups: RssAnon kB, RssFile kB, Threads', o)
dist.destroy_process_group()
