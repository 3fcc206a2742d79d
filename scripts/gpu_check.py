"""The CUDA path's check, in three parts (under 8 minutes on one GPU; `bash scripts/gpu_check.sh` runs this from
src/ with the machine's own torch, installing nothing):

1. speed: the Transformer LM at GPT-2-small size (768 wide, 12 layers, 12 heads, 50257 words, 1024 tokens) in
   bf16-mixed for 50 steps: `tessel train` on one GPU (nccl) beside the same model in a plain torch loop with
   autocast, 3 pairs of runs in alternating order (`--rounds`), medians; tokens/s and model FLOP utilisation
   (6 x parameters + attention per token, against the card's dense bf16 peak where the card is known).
2. collectives: two ranks sharing the GPU over gloo, every torch.distributed call tessel.comm makes tried on CUDA
   tensors directly (gloo runs some on CUDA tensors and refuses others; each line says which; tessel.comm sends
   and receives through host copies under gloo, so its pipelines do not depend on gloo's CUDA p2p).
3. parity: dp2 x pp2 (LSTM LM, sampled softmax, ps tables) and dp2 x tp2 (Transformer LM, sampled softmax, ps
   tables), four ranks sharing the GPU over gloo with CUDA tensors, in float64, their losses per step against
   one process's.

`--wiring` runs the same three parts on the CPU with tiny shapes (what the test suite runs, so this cannot rot).
Exit status: 0 when every part ran and every parity held; 1 otherwise (each failure is printed, the rest still run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

# dense bf16 peak of the cards this has been pointed at (FLOP/s); others print no utilisation
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}
GPT2_SMALL = ["--model", "transformer_lm", "--model.dim", "768", "--model.layers", "12", "--model.heads", "12",
              "--vocab", "50257", "--seq-len", "1024", "--batch", "8"]
TINY = ["--model", "transformer_lm", "--model.dim", "16", "--model.layers", "2", "--model.heads", "2", "--vocab",
        "128", "--seq-len", "8", "--batch", "8"]
# the torch.distributed calls tessel.comm makes (reduce_scatter is its all_to_all and a local sum)
COLLECTIVES = ["all_reduce", "all_gather_single", "all_to_all_single", "broadcast", "send/recv"]


def launch_train(argv: list[str]) -> str | None:
    """`python -m tessel train ARGV` to completion in its own processes; None, or the error it ended with (the
    launcher's one line, and above it the worker's own: its traceback's last lines)."""
    r = subprocess.run([sys.executable, "-m", "tessel", "train", *argv], capture_output=True, text=True, timeout=480)
    return None if r.returncode == 0 else "\n    ".join(r.stderr.strip().splitlines()[-12:] or
                                                         [f"exit {r.returncode}"])


def tessel_train(*args: str, out: Path) -> dict:
    """Run `tessel train` to completion; its summary with the loss of every step, or {"error": what it said}."""
    error = launch_train([*args, "--out", str(out), "--metrics.progress", "log", "--metrics.plot", "false",
                          "--checkpoint.enabled", "false", "--metrics.memory", "false"])
    if error is not None:
        return {"error": error}
    summary = json.loads((out / "summary.json").read_text())
    summary["losses"] = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary


def config(flags: list[str]):
    from tessel.cli import config_from_args, parser

    return config_from_args(parser().parse_args(["train", *flags]))


def flops_per_token(cfg) -> float:
    """Training FLOPs per token: 6 per weight (forward 2, backward 4) plus attention's scores and mixing."""
    d, layers, hidden = cfg.model.dim, cfg.model.layers, cfg.model.hidden or 4 * cfg.model.dim
    weights = layers * (4 * d * d + 2 * d * hidden) + d * cfg.data.vocab_size  # blocks and head; tables no GEMM
    return 6 * weights + 12 * layers * d * cfg.data.seq_len


def plain_loop(flags: list[str], steps: int, device: str) -> float:
    """tokens/s of the same model in a plain torch loop: AdamW, autocast bf16, the loss in the model, torch's
    clip_grad_norm_ at the run's max norm; nothing read back to the host until the end."""
    from tessel.data import ShardedLoader
    from tessel.train.build import build, build_data

    cfg = config(flags)
    data = build_data(cfg)
    torch.manual_seed(0)
    model = build(cfg, data.vocab_size).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    loader = ShardedLoader(data, cfg.train.global_batch, 0, 1)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for step in range(steps + 5):  # 5 warm-up steps, not timed
        if step == 5:
            sync()
            start = time.perf_counter()
        x, y = (t.to(device) for t in loader.next_batch())
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        if cfg.train.clip > 0:  # the same work as tessel's step: torch's clipping at the run's max norm
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return steps * cfg.train.global_batch * cfg.data.seq_len / (time.perf_counter() - start)


def speed(wiring: bool, work: Path, rounds: int) -> bool:
    """`tessel train` and the plain loop in turn, `rounds` times, the first of each pair alternating."""
    device, backend = ("cpu", "gloo") if wiring else ("cuda", "nccl")
    flags, steps = (TINY, 4) if wiring else (GPT2_SMALL, 50)
    cfg = config(flags)
    runs: dict[str, list[float]] = {"tessel train": [], "plain torch + autocast": []}
    for r in range(rounds):
        for who in sorted(runs, reverse=bool(r % 2)):
            if who == "plain torch + autocast":
                runs[who].append(plain_loop(flags, steps, device))
                continue
            run = tessel_train(*flags, "--nproc", "1", "--parallel.backend", backend, "--train.precision",
                               "bf16-mixed", "--steps", str(steps), out=work / f"speed-{r}")
            if "error" in run:
                print(f"speed: tessel train failed: {run['error']}")
                return False
            runs[who].append(run["median_tokens_per_s"])
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    per_token = flops_per_token(cfg)
    for who, tps in runs.items():
        mid = statistics.median(tps)
        mfu = f"{100 * mid * per_token / peak:.1f}%" if peak else "n/a (peak of this card unknown)"
        print(f"speed: {who:24s} {mid:12.0f} tokens/s (median of {rounds}: "
              f"{', '.join(f'{t:.0f}' for t in tps)})  MFU {mfu}  ({name}, bf16-mixed, {steps} steps)")
    print(f"speed: the host makes a batch in {data_ms(cfg):.1f} ms")
    return True


def data_ms(cfg) -> float:
    """Milliseconds to make one batch of the run's data on this host (median of 10)."""
    from tessel.data import ShardedLoader
    from tessel.train.build import build_data

    loader, times = ShardedLoader(build_data(cfg), cfg.train.global_batch, 0, 1), []
    for _ in range(10):
        start = time.perf_counter()
        loader.next_batch()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def collectives() -> None:
    """In each of two ranks (torchrun): gloo itself asked to run each call on a tensor on this rank's device (not
    through tessel.comm, whose staging would hide what gloo refuses); rank 0 prints. Values are checked."""
    dist.init_process_group("gloo")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    me, results = dist.get_rank(), {}
    for name in COLLECTIVES:
        x = torch.full((4, 2), float(me + 1), device=dev)
        try:
            if name == "all_reduce":
                dist.all_reduce(x)
                good = bool((x == 3).all())
            elif name == "all_gather_single":
                out = torch.empty(8, 2, device=dev)
                dist.all_gather_into_tensor(out, x)
                good = bool((out[:4] == 1).all() and (out[4:] == 2).all())
            elif name == "all_to_all_single":
                out = torch.empty_like(x)
                dist.all_to_all_single(out, x)
                good = bool((out[:2] == 1).all() and (out[2:] == 2).all())
            elif name == "broadcast":
                dist.broadcast(x, 0)
                good = bool((x == 1).all())
            else:
                (dist.send if me == 0 else dist.recv)(x, 1 - me)
                good = bool((x == 1).all())
            results[name] = "ok" if good else "wrong values"
        except Exception as e:  # noqa: BLE001 (the point is to list what fails)
            results[name] = "refused: " + str(e).splitlines()[0][:140]
        if me == 0:  # as it goes: a call that crashes the process still leaves the lines before it
            print(f"collectives: gloo, {dev} tensors, {name:18s} {results[name]}", flush=True)
    dist.destroy_process_group()


def parity(wiring: bool, work: Path, only: str = "") -> bool:
    device = "cpu" if wiring else "cuda"
    common = ["--dtype", "float64", "--steps", "4", "--parallel.backend", "gloo", "--parallel.device", device,
              "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1", "--metrics.log_every", "1",
              "--sparse.max_touched", "1.0", "--model.softmax", "sampled", "--model.num_sampled", "16",
              "--vocab", "256", "--seq-len", "8", "--batch", "8"]
    cases = {"dp2-pp2 lstm_lm ps": ["--model", "lstm_lm", "--model.dim", "16", "--model.layers", "2", "--sparse",
                                    "ps", "--micro-batches", "2"],
             "dp2-tp2 transformer_lm ps": ["--model", "transformer_lm", "--model.dim", "16", "--model.layers", "2",
                                           "--model.heads", "2", "--sparse", "ps"]}
    layouts = {"dp2-pp2 lstm_lm ps": ["--dp", "2", "--pp", "2"],
               "dp2-tp2 transformer_lm ps": ["--dp", "2", "--tp", "2"]}
    good = True
    for name, flags in cases.items():
        if only and not name.startswith(tuple(only.split(","))):
            continue
        one = tessel_train(*common, *flags, "--nproc", "1", "--sparse", "dense", out=work / f"{name}-1")
        four = tessel_train(*common, *flags, *layouts[name], out=work / f"{name}-4")
        if "error" in one or "error" in four:
            print(f"parity: {name}: failed: {one.get('error') or four.get('error')}")
            good = False
            continue
        gap = max(abs(a - b) for a, b in zip(one["losses"], four["losses"]))
        ok = len(one["losses"]) == len(four["losses"]) == 4 and gap < 1e-9
        print(f"parity: {name} on {device} (4 ranks, gloo) vs one process, float64, 4 steps: "
              f"max |loss gap| {gap:.1e} {'ok' if ok else 'FAILED (limit 1e-9)'}")
        good &= ok
    return good


def collectives_in_two_ranks(wiring: bool) -> bool:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__,
                        "--collectives"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if wiring else {})})
    print(r.stdout, end="")
    said, good = collectives_verdict(r.stdout, r.returncode, r.stderr)
    if said:
        print(said)
    return good


def collectives_verdict(stdout: str, returncode: int, stderr: str) -> tuple[str, bool]:
    """(a line to add, whether the part passed) for the two ranks' run of :func:`collectives`. send/recv runs last,
    and gloo aborts the process on CUDA tensors there (on every GPU run so far); tessel.comm sends and receives
    through host copies under gloo, so tessel's path never meets it: where every call before it was ok, that abort
    is said as such and the part passes (tests/test_gpu_check.py).
    """
    if returncode == 0:
        return "", True
    done = [ln for ln in stdout.splitlines() if ln.startswith("collectives: gloo, ")]
    if len(done) == len(COLLECTIVES) - 1 and all(ln.endswith(" ok") for ln in done):
        return (f"collectives: gloo, cuda tensors, {COLLECTIVES[-1]:18s} not supported: the process aborted in it; "
                "tessel.comm sends through host copies under gloo"), True
    return "collectives: failed: " + " | ".join(stderr.strip().splitlines()[-3:]), False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wiring", action="store_true", help="CPU, tiny shapes: check the wiring, not the card")
    p.add_argument("--parts", default="speed,collectives,parity", help="which parts to run (comma-separated)")
    p.add_argument("--rounds", type=int, help="speed: pairs of runs, in alternating order (3; 1 with --wiring)")
    p.add_argument("--cases", default="", help="parity: only the cases whose names start so (comma-separated, "
                   "e.g. dp2-tp2)")
    p.add_argument("--collectives", action="store_true", help=argparse.SUPPRESS)  # one torchrun rank of part 2
    ns = p.parse_args()
    if ns.collectives:
        collectives()
        return 0
    if not ns.wiring and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --wiring to check the wiring on the CPU", file=sys.stderr)
        return 2
    print(f"gpu_check: torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() and not ns.wiring else 'cpu (wiring)'}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        good = speed(ns.wiring, work, ns.rounds or (1 if ns.wiring else 3)) if "speed" in ns.parts else True
        if "collectives" in ns.parts:
            good &= collectives_in_two_ranks(ns.wiring)
        if "parity" in ns.parts:
            good &= parity(ns.wiring, work, ns.cases)
    print(f"gpu_check: {'all parts ran, parity held' if good else 'FAILED (see above)'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
