# rank 3 of a tessel run: every 20 ms, its RssAnon, glibc's bytes in use (mallinfo2: heap in use + mmapped) and
# CPython's allocated blocks; at exit, the sample where RssAnon was highest (to stderr)
import os
if os.environ.get("LOCAL_RANK") == "3" and os.environ.get("HWTAG"):
    import atexit, ctypes, sys, threading, time
    class MI(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI
    best = [0, None]
    def anon():
        for l in open("/proc/self/status"):
            if l.startswith("RssAnon"): return int(l.split()[1]) / 1024
    def loop():
        while True:
            a = anon()
            if a > best[0]:
                m = libc.mallinfo2()
                best[0], best[1] = a, (round((m.uordblks + m.hblkhd) / 2**20, 1), round(m.fordblks / 2**20, 1),
                                       sys.getallocatedblocks())
                _said()
            time.sleep(0.02)
    def _said():
        with open(f"/tmp/hw/{os.environ['HWTAG']}.txt", "w") as f:
            f.write(f"{os.environ['HWTAG']}: peak RssAnon {best[0]:.1f} MiB; then malloc in use {best[1][0]} MiB, "
                    f"free in heap {best[1][1]} MiB, python blocks {best[1][2]}\n")
    threading.Thread(target=loop, daemon=True).start()
