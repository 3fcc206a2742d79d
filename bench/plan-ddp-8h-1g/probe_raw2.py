import json, statistics, time, torch, torch.distributed as dist
from tessel import comm
from tessel.planner import probe as P

def main():
    dist.init_process_group("gloo"); torch.set_num_threads(1)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    for _ in range(3): comm.all_reduce(torch.zeros(1), "probe")
    bulk = torch.zeros((8 << 20) // 4)
    alone = statistics.median(P.loaded(bulk, a, w, 6, 6))
    # compute alone, long enough to span many periods
    comm.barrier("probe")
    res = {}
    for nb in (20, 60, 120):
        cs, xs, ys, cpu_c, cpu_y = [], [], [], [], []
        for _ in range(5):
            comm.barrier("probe")
            t0 = time.perf_counter(); c0 = time.thread_time(); P.compute_burst(a, w, nb); cs.append(time.perf_counter() - t0); cpu_c.append(time.thread_time()-c0)
            comm.barrier("probe")
            t0 = time.perf_counter(); wk = comm.all_reduce(bulk, "probe", async_op=True)
            c0 = time.thread_time(); P.compute_burst(a, w, nb); ys.append(time.perf_counter() - t0); cpu_y.append(time.thread_time()-c0)
            wk.wait(); xs.append(time.perf_counter() - t0)
        res[nb] = [statistics.median(v) for v in (cs, ys, xs, cpu_c, cpu_y)]
    rows = torch.tensor([[alone] + res[nb] for nb in (20, 60, 120)], dtype=torch.float64)
    st = torch.stack(comm.all_gather(rows, "probe"))  # ranks, 3, 6
    if dist.get_rank() == 0:
        print("cols: alone, compute alone, compute under AR, both done, cpu alone, cpu under AR (ms; median over ranks / max)")
        for i, nb in enumerate((20, 60, 120)):
            print(nb, [round(float(x)*1e3,1) for x in st[:, i].median(0).values], [round(float(x)*1e3,1) for x in st[:, i].max(0).values])
    dist.destroy_process_group()
main()
