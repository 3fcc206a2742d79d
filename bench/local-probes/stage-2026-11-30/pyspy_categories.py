"""Stage 1's main-thread samples inside the engine's step by what they were in (outputs.txt), from the py-spy raw
file: python3 pyspy_categories.py pyspy-stage1-native.txt.gz"""
import collections, gzip, sys
BLOCK = ('UnboundBuffer::wait', 'RecvWork::wait', 'SendWork::wait', 'pthread_cond', 'futex', 'epoll_wait', 'poll',
         '__GI___poll', 'nanosleep', 'sem_wait')
tot, cat = 0, collections.Counter()
for line in gzip.open(sys.argv[1], "rt"):
    stack, n = line.rsplit(' ', 1)
    n, frames = int(n), [f.split(' (')[0] for f in stack.split(';')]
    tot += n
    if not any('_StageEngine.step' in f for f in frames):
        cat['outside step'] += n
    elif any(b in f for f in frames for b in BLOCK):
        cat['blocked wait'] += n
    elif 'Runner.forward' in frames:
        cat['layers forward'] += n
    elif '_engine_run_backward' in frames:
        cat['autograd backward'] += n
    elif 'writev' in frames or 'sendmsg' in frames:
        cat['socket write'] += n
    elif 'StepTail.__call__' in frames:
        cat['step tail'] += n
    else:
        cat['other'] += n
print('total', tot)
for k, v in cat.most_common():
    print(f"{v:5d} {v / tot:5.1%} {k}")
