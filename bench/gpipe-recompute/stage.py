"""One hidden stage of the plan check's classifier (layer net.2: 1024 x 1024 and a ReLU) alone in this process, one
thread: 4 micro-batches of 16 samples forward, then their backwards (GPipe's order on a stage), plain and with the
layer recomputed (tessel.chain.recomputed), 60 times each; the main thread's CPU, median and fastest over the last 50.
With ``--beside``, a second process runs the same size of matrix products on the other core meanwhile.

    python bench/gpipe-recompute/stage.py; python bench/gpipe-recompute/stage.py --beside"""
import multiprocessing
import statistics
import sys
import time

import torch


def busy(seconds: float) -> None:
    torch.set_num_threads(1)
    w, t0 = torch.randn(1024, 1024, requires_grad=True), time.time()
    while time.time() - t0 < seconds:
        (torch.randn(16, 1024, requires_grad=True) @ w).relu().sum().backward()


def main() -> None:
    from tessel.bench import plan_check as pc
    from tessel.chain import Runner, chain_of, recomputed
    from tessel.config import load_config
    from tessel.resolve import job_of
    torch.set_num_threads(1)
    model = job_of(load_config(None, [*pc.MODELS["classifier"], *pc.COMMON])).build()
    chain = chain_of(model)
    for name, c in (("plain", chain), ("recompute", recomputed(chain, model))):
        stage, took = Runner(model, c, 1, 2), []
        for _ in range(60):
            xs = [torch.randn(16, 1024, requires_grad=True) for _ in range(4)]
            gs = [torch.randn(16, 1024) for _ in range(4)]
            t0 = time.thread_time()
            for y, g in zip([stage(x) for x in xs], gs):
                y.backward(g)
            took.append(time.thread_time() - t0)
        print(f"{name}: median {statistics.median(took[10:]) * 1e3:.2f} ms, fastest {min(took[10:]) * 1e3:.2f} ms "
              "for 4 micro-batches")


if __name__ == "__main__":
    other = multiprocessing.Process(target=busy, args=(30.0,)) if "--beside" in sys.argv else None
    if other:
        other.start()
        time.sleep(1.0)
    main()
    if other:
        other.terminate()
        other.join()
