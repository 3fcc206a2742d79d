import time, torch, sys
torch.set_num_threads(1)
a, w = torch.randn(128, 128), torch.randn(128, 512)
x = torch.randn(128, 512); W2 = torch.randn(512, 128)
def it():
    h = torch.nn.functional.gelu(a @ w); return h @ W2
for _ in range(200): it()
c, t = time.thread_time(), time.perf_counter()
n = 4000
for _ in range(n): it()
print(f"{sys.argv[1]} cpu {1e6*(time.thread_time()-c)/n:.1f} us/it wall {1e6*(time.perf_counter()-t)/n:.1f} us/it", flush=True)
