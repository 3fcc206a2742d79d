"""The prepared loop against ``tessel train`` and against the same loop under plain DDP, on emulated hosts.

Three jobs per repeat, in alternating order, each on every host (one worker per host): ``tessel train`` on the
LSTM LM (sampled softmax, 200K words) with a given table strategy; this file's own loop on the same model,
data, batch, optimizer and strategy through ``tessel.prepare``; the same loop with ``plan="dense"`` (DDP
all-reduces the whole tables). Step times: the median of each run's steps after 3 warm-up steps; per job the
median over repeats, and each ratio's 95% interval from the per-repeat ratios (a t interval on their logs).

    sudo python examples/prepare_bench.py --hosts 4 --rate 1gbit --steps 20 --repeats 3 --out runs/prepare-bench

With ``--pp 2`` the jobs are ``tessel train --pp 2`` and the loop prepared with ``ParallelPlan(dp=hosts/2, pp=2)``
(``model.step``), both with 2 micro-batches, flushed 1F1B and the tables served inside their stages; the
LSTM LM's two pipeline layers leave one cut, so both run the same stages. No DDP job then.

    sudo python examples/prepare_bench.py --hosts 4 --rate 1gbit --pp 2 --out runs/prepare-bench-pp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

MODEL = ["--model", "lstm_lm", "--model.softmax", "sampled", "--data.vocab_size", "200000", "--batch", "32",
         "--optimizer", "adagrad", "--lr", "0.05"]


def worker(plan: str, steps: int, out: str, pp: int = 1) -> None:
    """One rank of the prepared loop: tessel's LSTM LM and data, an optimizer and loop written as a user would."""
    import torch

    import tessel
    from tessel.data import ShardedLoader
    from tessel.resolve import settings_of
    from tessel.train.build import build, build_data

    cfg = tessel.load_config(None, ["model.name=lstm_lm", "model.softmax=sampled", "data.vocab_size=200000",
                                    "train.lr=0.05", f"train.steps={steps}"])
    data = build_data(cfg)
    torch.manual_seed(cfg.train.seed)
    model = build(cfg, data.vocab_size)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    whole = ShardedLoader(data, 32, 0, 1)  # the global batches, in tessel train's order
    batches = [whole.next_batch() for _ in range(steps)]
    if pp > 1:  # tessel train's pipeline: 2 micro-batches, flushed 1F1B, every table served by ``plan``
        tables = tuple(tessel.TableChoice(t.name, plan) for t in tessel.sparse.find_tables(model))
        dims = tessel.ParallelPlan(dp=int(os.environ["WORLD_SIZE"]) // pp, pp=pp, micro_batches=2, tables=tables)
        model, optimizer, loader = tessel.prepare(model, optimizer, batches, plan=dims, max_norm=1.0)
    else:
        model, optimizer, loader = tessel.prepare(model, optimizer, batches, plan=plan)
    rule = settings_of(cfg)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: rule.lr_at(s) / rule.lr)  # train's
    times, t0 = [], time.perf_counter()
    for x, y in loader:
        if pp > 1:
            loss = model.step(x, y)
        else:
            loss = model(x, y)
            loss.backward()
            tessel.clip_grad_norm_(model, 1.0)
            optimizer.step()
            optimizer.zero_grad()
        schedule.step()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    if torch.distributed.get_rank() == 0:
        Path(out).write_text(json.dumps({"median_step_time": statistics.median(times[3:]), "loss": loss.item()}))


def main(args) -> None:
    from tessel.bench.stats import interval
    from tessel.cluster.emulate import EmulatedCluster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    pp = ["--pp", str(args.pp), "--micro-batches", "2"] if args.pp > 1 else []
    jobs = {
        "tessel train": lambda d: ["-m", "tessel", "train", *MODEL, *pp, "--sparse", args.plan, "--steps",
                                   str(args.steps), "--metrics.progress", "log", "--metrics.plot", "false",
                                   "--checkpoint.enabled", "false", "--out", str(d)],
        "prepare": lambda d: [me, "--worker", "--plan", args.plan, "--pp", str(args.pp), "--steps", str(args.steps),
                              "--out", str(d)],
        "prepare, plan=dense (DDP)": lambda d: [me, "--worker", "--plan", "dense", "--steps", str(args.steps),
                                                "--out", str(d)],
    }
    if args.pp > 1 or args.no_ddp:  # a pipeline has no plain-DDP twin here; --no-ddp: more repeats per minute
        del jobs["prepare, plan=dense (DDP)"]
    times = {j: [] for j in jobs}
    with EmulatedCluster(args.hosts, args.rate) as c:
        for r in range(args.repeats):
            for k, (name, cmd) in enumerate(list(jobs.items())[:: 1 if r % 2 == 0 else -1]):
                d = out / f"r{r}-{k}"
                c.run(c.torchrun_commands(cmd(d)), timeout=1800)
                result = json.loads(((d / "summary.json") if d.is_dir() else d).read_text())
                times[name].append(result["median_step_time"])
                print(f"repeat {r} {name:<28} {result['median_step_time'] * 1000:8.1f} ms/step", flush=True)
    axes = f"dp={args.hosts // args.pp} x pp={args.pp} (2 micro-batches, 1f1b), " if args.pp > 1 else ""
    lines = [f"{args.hosts} emulated hosts at {args.rate}, {axes}LSTM LM 200K words (sampled softmax), batch 32, "
             f"Adagrad, tables '{args.plan}'; {args.steps} steps per run (median after 3), {args.repeats} repeats "
             "in alternating order; ratio: per-repeat pairs, 95% t interval", "",
             "| job | median ms/step | min-max | its time / prepare's (95% CI) |", "|---|---|---|---|"]
    base = times["prepare"]
    for name, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        r = interval(ratios)  # geometric mean over the repeats, with its t interval
        lines.append(f"| {name} | {statistics.median(ts) * 1000:.1f} | {min(ts) * 1000:.1f}-{max(ts) * 1000:.1f} | "
                     f"{r.value:.3f}x ({r.low:.3f}-{r.high:.3f}) |")
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", default="ps")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (then tessel train vs model.step only)")
    p.add_argument("--no-ddp", action="store_true", help="leave out the plain-DDP job (20x slower per step)")
    p.add_argument("--out", default="runs/prepare-bench")
    a = p.parse_args()
    if a.worker:
        from tessel import shutdown

        worker(a.plan, a.steps, a.out, a.pp)
        shutdown()  # after worker(): its model is gone, so no group outlives the world
    else:
        main(a)
    sys.exit(0)
