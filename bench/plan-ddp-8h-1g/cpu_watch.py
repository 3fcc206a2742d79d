"""Run a command; sample machine CPU (/proc/stat) and each host cgroup's processes' CPU and throttling."""
import subprocess, sys, time, os, glob
HZ = os.sysconf("SC_CLK_TCK")
def stat():
    f = open("/proc/stat").readline().split()[1:]
    return list(map(int, f))  # user nice system idle iowait irq softirq steal
def hosts():
    out = {}
    for g in sorted(glob.glob("/sys/fs/cgroup/cpu/tessel/tsl-h*")):
        name = os.path.basename(g)
        cpu = 0
        for pid in open(g + "/cgroup.procs").read().split():
            try:
                s = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                cpu += int(s[11]) + int(s[12])  # utime stime (all threads)
            except OSError:
                pass
        thr = dict(l.split() for l in open(g + "/cpu.stat"))
        out[name] = (cpu, int(thr["throttled_time"]), int(thr["nr_throttled"]), int(thr["nr_periods"]))
    return out
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
best, t0, s0 = {}, None, None
marks = []
import threading
lines = []
def reader():
    for l in p.stdout:
        lines.append((time.time(), l))
threading.Thread(target=reader, daemon=True).start()
samples = []
while p.poll() is None:
    try: n = sum(1 for _ in open(os.environ['MF']))
    except OSError: n = 0
    samples.append((time.time(), stat(), hosts(), n))
    time.sleep(0.25)
# window: from first 'step 4' line to last step line
steps = [(s[0], '') for s in samples if s[3] >= 3 and s[3] < int(os.environ['NS'])]
print("".join(l for _, l in lines[-6:]))
print("step lines:", len(steps))
if len(steps) >= 6:
    ta, tb = steps[3][0], steps[-1][0]
    win = [s for s in samples if ta <= s[0] <= tb]
    a, b = win[0], win[-1]
    dt = b[0] - a[0]
    d = [y - x for x, y in zip(a[1], b[1])]
    tot = sum(d)
    print(f"window {dt:.1f}s; machine: user {d[0]/tot:.0%} sys {d[2]/tot:.0%} softirq {d[6]/tot:.0%} idle {d[3]/tot:.0%}")
    for h in sorted(b[2]):
        if h in a[2] and not h.endswith("nic"):
            c = (b[2][h][0] - a[2][h][0]) / HZ
            thr = (b[2][h][1] - a[2][h][1]) / 1e9
            npr = b[2][h][3] - a[2][h][3]; nth = b[2][h][2] - a[2][h][2]
            print(f"{h}: cpu {c/dt:.3f} cores, throttled {nth}/{npr} periods, {thr:.1f}s")
