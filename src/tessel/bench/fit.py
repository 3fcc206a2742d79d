"""``tessel bench memory``: the largest model each plan trains on hosts with a memory limit, then every plan's step
at the largest size all of them train.

Eight emulated hosts, one worker each, each host held to a memory limit (a cgroup: the worker, torchrun's agent
and everything they hold count, and a host over it loses its worker to the kernel's OOM killer, as a device out
of memory ends a job). The model is the Transformer LM at a fixed width; only its depth varies. For each plan the
benchmark searches the depth: a run at a depth either trains its steps or runs out of memory, and the answer is
the deepest that trains with the next one failing, both run. The next depth to try comes from the hosts' own
peaks (a line through the two deepest runs that fitted, extrapolated to the limit), inside the bracket the runs
so far have set. The planner's pick is searched the same way: at each depth ``tessel plan`` (run here, beside
the cluster, on the topology it will run on: 8 hosts, their link rate and CPU share) is given the memory a rank
may hold (the limit less the most any worker held beside its tensors and FSDP's units in the runs so far on these
hosts; the planner prices the units itself) and either refuses (nothing fits: no worker starts) or its pick runs.

    sudo tessel bench memory --doc docs/benchmarks.md
    sudo tessel bench memory --strategies ddp,fsdp --repeats 1
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .stats import paired_ratio

LIMIT = 448 * 2**20  # each host's memory: about 70 MiB for tensors beside the ~380 MiB a worker and its agent hold
HOSTS, RATE = 8, "1gbit"
WIDTH = ["--model", "transformer_lm", "--model.dim", "256", "--model.heads", "8", "--data.vocab_size", "512",
         "--seq-len", "32", "--batch", "16"]
COMMON = ["--optimizer", "adamw", "--sparse", "dense", "--timeout", "600", "--metrics.progress", "log",
          "--metrics.plot", "false", "--checkpoint.enabled", "false"]
STRATEGIES = {
    "ddp": ["--dp", "8"],
    "fsdp": ["--dp", "8", "--dp-shard", "8"],
    "fsdp-tp": ["--dp", "4", "--dp-shard", "4", "--tp", "2", "--tp-mode", "1d"],
    "pp-tp-fsdp-recompute": ["--dp", "2", "--dp-shard", "2", "--pp", "2", "--tp", "2", "--tp-mode", "1d",
                             "--micro-batches", "2", "--train.recompute", "layers"],
    "planner": [],  # tessel plan's pick at each depth, under the memory a rank may hold
}
FIT_STEPS, TIME_STEPS = 3, 8  # a fit needs the second step's peak (Adam's state exists from the first)
MAX_RUNS = 8  # per plan: the search stops there and says so


def params_of(layers: int) -> int:
    """Parameters of the benchmark's model at ``layers`` blocks (counted on the meta device)."""
    from ..meta import on_meta
    from ..models.transformer_lm import TransformerLM

    with on_meta():
        m = TransformerLM(512, 32, dim=256, layers=layers, heads=8)
    return sum(p.numel() for p in m.parameters())


def _split(layers: int, flags: list[str]) -> list[str]:
    """A pipelined plan is given its cut (blocks halved; the embedding with the first, the head with the last), so
    its workers build the model on the meta device (a cut from timings would need the whole model on one rank)."""
    if "--pp" not in flags:
        return []
    first = layers // 2
    return ["--pipeline.split", f"{first + 1},{layers - first + 1}"]


def _plan(layers: int, budget: int, out: Path) -> tuple[Path | None, str]:
    """``tessel plan``'s pick at ``layers`` under ``budget`` bytes a rank (None and its reason if it refuses)."""
    path = out / "plan.json"
    cmd = [sys.executable, "-m", "tessel", "plan", *WIDTH, *COMMON[:4], "--model.layers", str(layers), "--nproc",
           str(HOSTS), "--hosts", str(HOSTS), "--link-mbit", "1000", "--speed", f"{2 / HOSTS:g}", "--memory-per-rank",
           str(budget), "--json", str(path)]
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    (out / "plan.txt").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["refused"])[-1]
    return path, json.loads(path.read_text())


def _run(emu, args: list[str], where: Path) -> dict:
    """One training run on the hosts: its summary's figures, or that it did not fit."""
    from ..cluster.emulate import HostFailed

    where.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        results = emu.run(emu.torchrun_commands([*args, "--out", str(where.resolve())]), timeout=1200)
    except HostFailed as e:
        for r in e.results:
            (where / f"host{r.host}.stderr").write_text(r.stderr or "")
        oom = any(r.out_of_memory for r in e.results)
        return {"fits": False, "oom": oom, "error": None if oom else str(e).splitlines()[0],
                "host_peak": max(r.peak_memory for r in e.results), "seconds": time.monotonic() - t0}
    s = json.loads((where / "summary.json").read_text())
    return {"fits": True, "host_peak": max(r.peak_memory for r in results),
            "host_peaks": [r.peak_memory for r in results], "measured": max(s.get("step_peak_mem_per_rank") or [0]),
            "measured_per_rank": s.get("step_peak_mem_per_rank"), "predicted": s.get("predicted_mem_per_rank"),
            "step_time": s["median_step_time"], "step_times": s.get("step_times"), "plan": s.get("plan"),
            "final_loss": s["final_loss"], "seconds": time.monotonic() - t0}


def _next(fits: dict[int, dict], fails: set[int], limit: int) -> int | None:
    """The next depth to try, or None once the deepest fit's next depth failed: the secant through the two deepest
    fits' host peaks to the limit (doubling up while nothing has failed, or where the peaks did not grow), or,
    where that lands on or past a depth that failed, halfway into the bracket (the planner's pick changes with the
    depth, so its peaks are no line)."""
    lo = max(fits, default=0)
    hi = min((f for f in fails if f > lo), default=None)
    if hi == lo + 1 or (hi is not None and hi <= 1):
        return None
    deep = sorted(fits)[-2:]
    guess = 2 * lo if lo else (hi // 2 if hi else 2)
    if len(deep) == 2:
        (a, b), (pa, pb) = deep, (fits[deep[0]]["host_peak"], fits[deep[1]]["host_peak"])
        if pb > pa:  # (a peak that did not grow, as a planner's new pick can give, draws no line: double)
            guess = min(b + int((limit - pb) / ((pb - pa) / (b - a))), 8 * b)  # (a line nearly flat: 8x at most)
    if hi is not None and guess >= hi:
        guess = (lo + hi) // 2
    top = hi - 1 if hi is not None else max(guess, lo + 1)
    return min(max(guess, lo + 1), top)


def search(name: str, emu, out: Path, budget: int | None, log, evidence: list[dict] | None = None) -> dict:
    """The deepest model plan ``name`` trains under the hosts' limit: every run made on the way. ``evidence``
    (earlier runs on these hosts): the planner's budget for each try is then the limit less what any of them or
    of this search's runs so far held beside its tensors and FSDP's units (:func:`overhead`), not ``budget``."""
    fits, fails, runs = {}, set(), []
    depth = 2
    while depth is not None and len(runs) < MAX_RUNS:
        where = out / "runs" / f"{name}-l{depth}"
        flags = list(STRATEGIES[name])
        rec = {"strategy": name, "layers": depth, "params": params_of(depth)}
        if name == "planner":
            if evidence is not None:
                budget = LIMIT - overhead(evidence + runs)
            rec["budget"] = budget
            path, picked = _plan(depth, budget, where)
            if path is None:
                rec.update(fits=False, refused=picked)
            else:
                flags, rec["pick"] = ["--plan", str(path)], picked
        if not rec.get("refused"):
            args = ["-m", "tessel", "train", *WIDTH, *COMMON, "--model.layers", str(depth), *flags,
                    *_split(depth, flags), "--steps", str(FIT_STEPS)]
            rec.update(_run(emu, args, where))
        runs.append(rec)
        (fits.__setitem__(depth, rec) if rec["fits"] else fails.add(depth))
        log(f"memory: {name} at {depth} layers ({rec['params'] / 1e6:.1f}M parameters): "
            + ("trains" if rec["fits"] else "refused by the planner" if rec.get("refused")
               else "out of memory" if rec.get("oom") else f"FAILED ({rec.get('error')})")
            + (f", host peak {rec['host_peak'] / 2**20:.0f} MiB" if rec.get("host_peak") else ""))
        depth = _next(fits, fails, LIMIT)
    best = max(fits, default=0)
    return {"strategy": name, "largest": best, "params": params_of(best) if best else 0,
            "bracketed": best + 1 in fails, "runs": runs}


def units_of(run: dict) -> int:
    """FSDP units the fullest stage of a run's plan ran (0 unsharded): its chain layers (the embedding, the
    blocks, the head) and its root, as the planner counts them (``planner.memory.fsdp_units``)."""
    from ..plan import ParallelPlan
    from ..planner.memory import fsdp_units

    plan = run.get("plan") or run.get("pick")
    if not isinstance(plan, dict):
        return 0
    plan = ParallelPlan.from_dict(plan)
    return max(fsdp_units(plan, plan.bounds or ((0, run["layers"] + 2),)))


def beside(run: dict) -> float:
    """What a run's fullest host held beside its measured tensors and its FSDP units' share (the planner prices
    that share: ``Topology.unit_memory``)."""
    from ..planner.topology import CPU_UNIT_MEMORY

    return run["host_peak"] - run["measured"] - units_of(run) * CPU_UNIT_MEMORY


def overhead(runs: list[dict]) -> int:
    """What a worker's host holds beside its tensors and FSDP's units, the most over ``runs`` that trained (every
    plan: a 3-D or pipelined worker holds more of it than DDP's)."""
    return int(max((beside(r) for r in runs if r.get("fits") and r.get("measured")), default=0))


def _runs(found: list[dict]) -> list[dict]:
    return [r for f in found for r in f["runs"]]


def timing(names: list[str], depth: int, emu, out: Path, budget: int, repeats: int, log) -> list[dict]:
    """Every plan at ``depth`` blocks, ``repeats`` rounds in alternating order: step times side by side."""
    recs = []
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            where = out / "runs" / f"time-{name}-l{depth}-r{rep}"
            flags = list(STRATEGIES[name])
            pick = None
            if name == "planner":
                path, pick = _plan(depth, budget, where)
                if path is None:
                    recs.append({"strategy": name, "repeat": rep, "fits": False, "refused": pick})
                    continue
                flags = ["--plan", str(path)]
            args = ["-m", "tessel", "train", *WIDTH, *COMMON, "--model.layers", str(depth), *flags,
                    *_split(depth, flags), "--steps", str(TIME_STEPS)]
            rec = {"strategy": name, "repeat": rep, "pick": pick, **_run(emu, args, where)}
            recs.append(rec)
            log(f"memory: {name} at {depth} layers, round {rep}: "
                + (f"{rec['step_time'] * 1000:.0f} ms/step" if rec["fits"] else "did not fit"))
    return recs


def _err(rec: dict) -> float | None:
    """The prediction's error on a run's fullest rank (predicted over measured, less one)."""
    pred = max(rec.get("predicted") or [0])
    return pred / rec["measured"] - 1 if pred and rec.get("measured") else None


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def _pick(rec: dict | None) -> str:
    from ..plan import ParallelPlan
    from ..planner.choose import short

    return short(ParallelPlan.from_dict(rec)) if isinstance(rec, dict) else "-"


def report(found: list[dict], timed: list[dict], depth: int, budget: int, argv: list[str]) -> str:
    from ..planner.topology import CPU_UNIT_MEMORY

    ddp = next((f["params"] for f in found if f["strategy"] == "ddp"), 0)
    lines = [
        f"Reproduce: `tessel {' '.join(shlex.quote(a) for a in argv)}` ({time.strftime('%Y-%m-%d')}). {HOSTS} emulated "
        f"hosts at {RATE}, one worker each, {2 / HOSTS:g} core each, each host held to {LIMIT / 2**20:.0f} MiB (a "
        "cgroup: worker, torchrun's agent and all they hold; over it the kernel kills the worker). Transformer LM, "
        "width 256, 8 heads, vocabulary 512, 32 tokens, global batch 16, AdamW, fp32; depth searched per plan, "
        f"{FIT_STEPS} steps a try. The planner is given the limit less the most any worker's host held beside "
        "its tensors and FSDP's units in the runs before each try (the units it prices itself, "
        f"{CPU_UNIT_MEMORY / 2**20:.2f} MiB each); {_mib(budget)} MiB a rank after the last. Host peak: the "
        "cgroup's most in use; tensors: "
        "measured (`PeakTensors`, the fullest rank) against tessel's prediction.",
        "",
        "| plan | largest depth | parameters | x DDP | next depth | host peak MiB | tensors measured / predicted MiB "
        "(error) | tries |",
        "|---|---|---|---|---|---|---|---|"]
    for f in found:
        at = next((r for r in f["runs"] if r["layers"] == f["largest"] and r.get("fits")), {})
        nxt = next((r for r in f["runs"] if r["layers"] == f["largest"] + 1), None)
        why = ("not tried" if nxt is None else "refused by the planner" if nxt.get("refused")
               else "out of memory" if nxt.get("oom") else "failed")
        e = _err(at) if at else None
        pick = f" ({_pick(at.get('pick'))})" if f["strategy"] == "planner" and at else ""
        lines.append(f"| {f['strategy']}{pick} | {f['largest']} | {f['params'] / 1e6:.2f}M | "
                     f"{f['params'] / ddp:.1f}x | {f['largest'] + 1}: {why} | "
                     f"{_mib(at.get('host_peak', 0))} | {_mib(at.get('measured', 0))} / "
                     f"{_mib(max(at.get('predicted') or [0]))} ({e:+.1%}) | {len(f['runs'])} |"
                     if at else f"| {f['strategy']} | none | - | - | - | - | - | {len(f['runs'])} |")
    errs = [(r["strategy"], r["layers"], _err(r)) for f in found for r in f["runs"] if r.get("fits") and _err(r)]
    errs += [(r["strategy"], depth, _err(r)) for r in timed if r.get("fits") and _err(r)]
    worst = max(errs, key=lambda t: abs(t[2]), default=None)
    within = sum(abs(e) <= 0.10 for *_, e in errs)
    lines += ["", f"Memory prediction on every run that trained: {within} of {len(errs)} within 10% of the measured "
              "tensor peak" + (f"; worst {worst[2]:+.1%} ({worst[0]} at {worst[1]} layers)." if worst else "."), ""]
    by, rounds_of = {}, {}
    for r in timed:
        if r.get("fits"):
            by.setdefault(r["strategy"], []).append(r["step_time"])
            rounds_of.setdefault(r["strategy"], {})[r["repeat"]] = r["step_time"]
    if by:
        best = min(statistics.median(v) for v in by.values())
        fastest = min(by, key=lambda n: statistics.median(by[n]))
        rounds = max(len(v) for v in by.values())
        some = "" if len(by) == len(found) else f", timed here: {', '.join(by)}"
        lines += [f"Step time at {depth} layers (the largest depth every plan trains{some}; {TIME_STEPS} steps a run, "
                  f"median of the steps after 3 warm-up, then the median over {rounds} rounds run in alternating "
                  "order, the same depth, data and steps for every plan"
                  + ("; fewer than 5 rounds: no interval is given and no ratio here is evidence" if rounds < 5 else "")
                  + "):", "",
                  f"| plan | ms/step (median) | rounds (ms) | vs best | over {fastest}, paired by round (95% "
                  "interval) |",
                  "|---|---|---|---|---|"]
        for name, v in by.items():
            pick = next((_pick(r.get("pick")) for r in timed if r["strategy"] == name and r.get("pick")), "")
            ratio = paired_ratio(rounds_of[name], rounds_of[fastest]) if name != fastest else None
            lines.append(f"| {name}{f' ({pick})' if pick else ''} | {statistics.median(v) * 1000:.0f} | "
                         f"{', '.join(f'{x * 1000:.0f}' for x in v)} | {statistics.median(v) / best:.2f}x | "
                         f"{ratio.text() + ' ' + ratio.verdict() if ratio else '-'} |")
    return "\n".join(lines) + "\n"


def main(ns, argv: list[str], check_paths) -> int:
    """``tessel bench memory``: search each plan's largest depth, time them all at the smallest of those."""
    from ..cluster.emulate import EmulatedCluster
    from ..errors import ConfigError
    from .report import update_doc

    chosen = [s.strip() for s in (ns.strategies or ",".join(STRATEGIES)).split(",") if s.strip()]
    bad = [s for s in chosen if s not in STRATEGIES]
    if bad:
        raise ConfigError(f"--strategies {','.join(bad)} not in the memory benchmark; valid: {', '.join(STRATEGIES)}")
    if "planner" in chosen and chosen[0] == "planner" and not ns.append and not ns.timing_only:
        raise ConfigError("--strategies with planner needs another plan before it (ddp, fsdp, fsdp-tp or "
                          "pp-tp-fsdp-recompute): its runs measure what a worker holds beside its tensors")
    out = Path(ns.out or "bench/memory")
    check_paths(out, ns.doc)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if ns.report_only:
        saved = json.loads((out / "results.json").read_text())
        found, timed, depth, budget, argv = (saved[k] for k in ("found", "timed", "depth", "budget", "argv"))
    elif ns.timing_only:  # the searches as saved; only the step times are measured again (the planner re-plans)
        if not (out / "results.json").is_file():
            raise ConfigError(f"--timing-only: no saved search in {out / 'results.json'}; valid: a folder a "
                              "'tessel bench memory' run wrote (--out)")
        saved = json.loads((out / "results.json").read_text())
        found, depth, budget = saved["found"], saved["depth"], saved["budget"]
        names = [f["strategy"] for f in found if f["strategy"] in chosen or not ns.strategies]  # default: all saved
        if set(chosen) - set(names) and ns.strategies:
            raise ConfigError(f"--timing-only: {', '.join(sorted(set(chosen) - set(names)))} not searched in "
                              f"{out / 'results.json'}; valid: {', '.join(f['strategy'] for f in found)}")
        with EmulatedCluster(HOSTS, rate=RATE, prefix="tsmem", memory=LIMIT) as emu:
            timed = timing(names, depth, emu, out, budget, ns.repeats, log)
        (out / "results.json").write_text(json.dumps({"found": found, "timed": timed, "depth": depth,
                                                      "budget": budget, "argv": argv}))
    else:
        # --append: the searches of the plans this invocation does not redo are kept
        saved = json.loads((out / "results.json").read_text())["found"] \
            if ns.append and (out / "results.json").is_file() else []
        kept = [f for f in saved if f["strategy"] not in chosen]
        earlier = _runs([f for f in saved if f["strategy"] in chosen])  # a search redone: its runs still measured
        found, budget = list(kept), 0
        with EmulatedCluster(HOSTS, rate=RATE, prefix="tsmem", memory=LIMIT) as emu:
            for name in chosen:
                evidence = _runs(found) + earlier if name == "planner" else None
                found.append(search(name, emu, out, budget, log, evidence))
                if evidence is not None:  # what the planner is given from here on (the timing's re-plans)
                    budget = LIMIT - overhead(evidence + found[-1]["runs"])
                found.sort(key=lambda f: list(STRATEGIES).index(f["strategy"]))
                (out / "results.json").write_text(json.dumps({"found": found, "timed": [], "depth": 0,
                                                              "budget": budget, "argv": argv}))
            depth = min(f["largest"] for f in found)
            names = [f["strategy"] for f in found]
            timed = timing(names, depth, emu, out, budget, ns.repeats, log) if depth else []
        (out / "results.json").write_text(json.dumps({"found": found, "timed": timed, "depth": depth,
                                                      "budget": budget, "argv": argv}))
    text = report(found, timed, depth, budget, argv)
    (out / "report.md").write_text(text)
    if ns.doc:
        update_doc(Path(ns.doc), "memory", text)
    print(text)
    return 0
