import os
if "LOCAL_RANK" in os.environ and os.environ.get("PIN"):
    cpus = sorted(os.sched_getaffinity(0)); n = int(os.environ["LOCAL_WORLD_SIZE"]); r = int(os.environ["LOCAL_RANK"])
    if len(cpus) >= n:
        per = len(cpus) // n
        os.sched_setaffinity(0, cpus[r * per:(r + 1) * per])
