"""A Hugging Face Llama with a 128K-word vocabulary under ``tessel.prepare``, against the same loop under plain DDP,
on emulated hosts.

The loop is a user's: a ``LlamaForCausalLM`` from a config (vocabulary 131072, width 64, 2 decoder layers, 4 heads
over 2 key/value heads), dict batches of 32 sequences of 32 tokens from tessel's Zipf corpus, Adagrad (whose row
updates are exact, so ``auto`` may serve the token table by rows), clipping at 1.0. Jobs per repeat, in
alternating order, one worker per host:

- ``auto``: ``prepare(plan="auto")`` on every host (dp = hosts), the cost model deciding the token table;
- ``pp2``: ``prepare(plan=ParallelPlan(dp=hosts/2, pp=2, micro_batches=2))`` (``model.step``), tables auto;
- ``dense``: ``prepare(plan="dense")``: plain DDP, every weight all-reduced (the baseline).

Step time: the median of a run's steps after 3 warm-up steps; per job the median over repeats, and each ratio's
95% interval from the per-repeat ratios (a t interval on their logs).

    sudo python examples/hf_bench.py --hosts 4 --rate 200mbit --steps 12 --repeats 5 --out runs/hf-bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

VOCAB, SEQ, BATCH = 131072, 32, 32


def worker(plan: str, steps: int, out: str) -> None:
    """One rank of the user's loop."""
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import tessel
    from tessel.data.zipf import ZipfCorpus

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    corpus = ZipfCorpus(vocab_size=VOCAB, seq_len=SEQ + 1, seed=0)
    batches = []
    for b in range(steps):
        ids = torch.as_tensor(corpus.tokens(np.arange(b * BATCH, (b + 1) * BATCH)), dtype=torch.long)[:, :SEQ]
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    piped = plan == "pp2"
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's; prepare joins the world below
    given = tessel.ParallelPlan(dp=max(1, world // 2), pp=2, micro_batches=2) if piped else plan
    model, optimizer, loader = tessel.prepare(model, optimizer, batches, plan=given, max_norm=1.0 if piped else 0.0,
                                              verbose=False)
    times, t0 = [], time.perf_counter()
    for batch in loader:
        if piped:
            loss = model.step(batch)
        else:
            loss = model(**batch).loss
            loss.backward()
            tessel.clip_grad_norm_(model, 1.0)
            optimizer.step()
            optimizer.zero_grad()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    if torch.distributed.get_rank() == 0:
        Path(out).write_text(json.dumps({"median_step_time": statistics.median(times[3:]), "loss": float(loss),
                                         "step_times": times[3:]}))


def main(args) -> None:
    from tessel.bench.stats import interval
    from tessel.cluster.emulate import EmulatedCluster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    jobs = ["dense", "auto", "pp2"]
    times = {j: [] for j in jobs}
    with EmulatedCluster(args.hosts, args.rate) as c:
        for r in range(args.repeats):
            for k, name in enumerate(jobs[:: 1 if r % 2 == 0 else -1]):
                d = out / f"r{r}-{name}.json"
                c.run(c.torchrun_commands([me, "--worker", "--plan", name, "--steps", str(args.steps), "--out",
                                           str(d)], run_id=f"hf{r}{k}"), timeout=3600)
                times[name].append(json.loads(d.read_text())["median_step_time"])
                print(f"repeat {r} {name:<6} {times[name][-1] * 1000:9.1f} ms/step", flush=True)
    lines = [f"{args.hosts} emulated hosts at {args.rate}, one worker each; LlamaForCausalLM, vocabulary {VOCAB}, "
             f"width 64, 2 layers, batch {BATCH} x {SEQ} tokens, Adagrad; {args.steps} steps per run (median after 3), "
             f"{args.repeats} repeats in alternating order; ratio: per-repeat pairs, 95% t interval", "",
             "| job | median ms/step | min-max | DDP's time / its time (95% CI) |", "|---|---|---|---|"]
    for name, ts in times.items():
        ratios = [d / t for d, t in zip(times["dense"], ts)]
        r = interval(ratios)  # geometric mean over the repeats, with its t interval
        lines.append(f"| {name} | {statistics.median(ts) * 1000:.1f} | {min(ts) * 1000:.1f}-{max(ts) * 1000:.1f} | "
                     f"{r.value:.2f}x ({r.low:.2f}-{r.high:.2f}) |")
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", default="auto")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="runs/hf-bench")
    a = p.parse_args()
    if a.worker:
        from tessel import shutdown

        worker(a.plan, a.steps, a.out)
        shutdown()  # after worker(): its model is gone, so no group outlives the world
    else:
        main(a)
    sys.exit(0)
