import os
if "LOCAL_RANK" in os.environ and os.environ.get("TAG"):
    import threading, time, resource
    def _watch():
        while True:
            time.sleep(0.5)
            r = resource.getrusage(resource.RUSAGE_SELF)
            with open(f"/tmp/grp/flt-{os.environ['TAG']}-{os.environ['LOCAL_RANK']}.txt", "w") as f:
                f.write(f"minflt {r.ru_minflt} utime {r.ru_utime:.2f} stime {r.ru_stime:.2f}\n")
    threading.Thread(target=_watch, daemon=True).start()
