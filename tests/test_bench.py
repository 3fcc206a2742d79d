"""tessel bench's arithmetic: medians, the physical bound, efficiency, ratios, the doc section; no cluster."""

import json
import math
import os
import statistics
from pathlib import Path

import pytest

from tessel.bench import cli as bench_cli
from tessel.bench import drift, plan_check, report, runner, scenarios, stats
from tessel.bench.compose_tables import compose_table
from tessel.cli import main
from tessel.cluster.emulate import HostFailed, HostResult


def _run(model, strategy, hosts, rate, repeat, step, sent=0.0, throughput=None):
    return {"model": model, "strategy": strategy, "hosts": hosts, "rate": rate, "repeat": repeat,
            "step_time": step, "throughput": throughput or 100.0 / step, "unit": "tokens",
            "bytes_per_step": {"dp.dense": sent}, "max_rank_sent_per_step": sent, "peak_mem": 2**20,
            "table_mem": 0, "final_loss": 1.0}


def _records():
    mb = 12.5e6  # 12.5 MB per step: 100 ms at 1 Gbit/s
    recs = []
    for rep, jitter in enumerate([0.0, 0.01, -0.01]):
        recs += [_run("lm", "tessel-ddp", 1, "unshaped", rep, 0.10 + jitter),
                 _run("lm", "torch-ddp", 1, "unshaped", rep, 0.10 + jitter),
                 _run("lm", "tessel-ddp", 2, "unshaped", rep, 0.06 + jitter, mb),
                 _run("lm", "torch-ddp", 2, "unshaped", rep, 0.06 + jitter),
                 _run("lm", "tessel-ddp", 2, "1gbit", rep, 0.125 + jitter, mb),
                 _run("lm", "torch-ddp", 2, "1gbit", rep, 0.25 + jitter)]
    return recs


def _scenario():
    scn = scenarios.get("ddp")
    scn.models = {"lm": []}
    scn.hosts, scn.rates = [1, 2], ["1gbit"]
    return scn


T_975_2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom (three rounds)


def _geo_interval(ratios):
    """Geometric mean of three paired ratios and its 95% t interval, written out here, not taken from stats."""
    logs = [math.log(x) for x in ratios]
    mean = sum(logs) / 3
    half = T_975_2 * math.sqrt(sum((v - mean) ** 2 for v in logs) / 2) / math.sqrt(3)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def test_bound_efficiency_and_ratios():
    rows = {(r["strategy"], r["hosts"], r["rate"]): r for r in report.aggregate(_records(), _scenario())}
    assert ("tessel-ddp", 2, "unshaped") not in rows  # compute-only runs feed the bound, they are no rows
    mine = rows[("tessel-ddp", 2, "1gbit")]
    assert mine["step_time"] == pytest.approx({"median": 0.125, "min": 0.115, "max": 0.135, "n": 3,
                                               "spread": 0.02 / 0.125})
    assert mine["compute_only"] == pytest.approx(0.06)
    assert mine["comm_bound"] == pytest.approx(0.1)  # 12.5e6 B * 8 / 1e9 bit/s
    assert mine["balanced_rate"] == pytest.approx(12.5e6 * 8 / 0.06)  # bytes take as long as compute-only
    # per round: max(compute-only of that round, bound) / measured of that round
    eff = _geo_interval([0.1 / 0.125, 0.1 / 0.135, 0.1 / 0.115])
    assert (mine["efficiency"], mine["efficiency_ci"]["low"], mine["efficiency_ci"]["high"]) == pytest.approx(eff)
    vs = _geo_interval([0.25 / 0.125, 0.26 / 0.135, 0.24 / 0.115])  # baseline over mine, round by round
    assert (mine["vs_baseline"], mine["vs_baseline_ci"]["low"], mine["vs_baseline_ci"]["high"]) == pytest.approx(vs)
    assert mine["vs_baseline_ci"]["n"] == 3
    # torch's own DDP is not counted; it is given the bytes of the strategy that moves the same ones
    theirs = rows[("torch-ddp", 2, "1gbit")]
    assert theirs["comm_bound"] == pytest.approx(0.1)
    assert theirs["efficiency"] == pytest.approx(_geo_interval([0.1 / 0.25, 0.1 / 0.26, 0.1 / 0.24])[0])


def test_ratio_intervals_and_verdicts():
    r = stats.paired_ratio({0: 2.0, 1: 2.2, 2: 1.8, 3: 9.0}, {0: 1.0, 1: 1.0, 2: 1.0})  # round 3 has no pair
    assert (r.value, r.low, r.high) == pytest.approx(_geo_interval([2.0, 2.2, 1.8])) and r.n == 3
    assert r.verdict() == "above" and r.text() == f"{r.value:.2f}x ({r.low:.2f}–{r.high:.2f})"
    assert stats.paired_ratio({0: 1.0, 1: 1.0, 2: 1.0}, {0: 2.0, 1: 2.2, 2: 1.8}).verdict() == "below"
    assert stats.paired_ratio({0: 1.0, 1: 1.1}, {0: 1.05, 1: 1.0}).verdict() == "noise"
    one = stats.paired_ratio({0: 1.5}, {0: 1.0})
    assert one.n == 1 and math.isnan(one.low) and one.verdict() == "one run" and "no interval" in one.text()
    assert stats.paired_ratio({0: 1.0}, {1: 1.0}) is None
    assert stats.spread([0.9, 1.0, 1.2]) == pytest.approx(0.3)


def test_efficiency_above_one_only_by_noise():
    # a shaped run faster than the compute-only run of its round can only be noise: the interval must include 1
    recs = []
    for rep, (compute, shaped) in enumerate([(0.100, 0.095), (0.100, 0.104), (0.100, 0.097)]):
        recs += [_run("lm", "tessel-ddp", 2, "unshaped", rep, compute, 1.0),
                 _run("lm", "tessel-ddp", 2, "1gbit", rep, shaped, 1.0)]
    row = next(r for r in report.aggregate(recs, _scenario()) if r["rate"] == "1gbit")
    ci = row["efficiency_ci"]
    assert row["efficiency"] > 1 and ci["low"] < 1 < ci["high"]
    assert stats.Ratio(**ci).verdict() == "noise"


def test_header_states_the_runs_each_cell_had(tmp_path):
    recs = [r for r in _records() if r["repeat"] == 0]
    text = report.write(recs, _scenario(), tmp_path, 1, ["tessel bench ddp --repeats 1"])
    assert "one run per cell, so no intervals" in text and "(1 run, no interval)" in text
    mixed = _records() + [_run("lm", "tessel-ddp", 2, "1gbit", 3, 0.125, 12.5e6)]
    text = report.markdown(report.aggregate(mixed, _scenario()), _scenario(), report.environment(_scenario(), 4), [])
    assert "3–4 runs per cell (the runs column gives each)" in text
    assert statistics.median([0.125, 0.135, 0.115, 0.125]) * 1e3 == 125.0 and "| 4 | 125.0 (115.0–135.0) |" in text


def test_environment_names_the_cpu_and_its_bf16_arithmetic(monkeypatch, tmp_path):
    """bf16-mixed's speed on CPU turns on the ISA, so a run records it; a run saved before it was recorded renders
    without it."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx512f avx512_bf16\n\n"
                    "processor\t: 1\nmodel name\t: Some CPU\nflags\t\t: fpu avx512f avx512_bf16\n")
    from tessel.bench import machine

    real = machine.Path
    monkeypatch.setattr(machine, "Path", lambda p: info if p == "/proc/cpuinfo" else real(p))
    env = report.environment(_scenario(), 2)
    assert env["cpu"] == {"model": "Some CPU", "bf16": True}
    info.write_text("model name\t: Other CPU\nflags\t\t: fpu avx2 avx512f\n")
    assert machine.cpu() == {"model": "Other CPU", "bf16": False}
    rows = report.aggregate(_records(), _scenario())
    text = report.markdown(rows, _scenario(), env, [])
    assert f"{env['cores']} cores (Some CPU, bf16 arithmetic: yes) shared" in text
    del env["cpu"]
    assert " cores shared by the emulated hosts" in report.markdown(rows, _scenario(), env, [])


def test_every_row_has_a_cell_under_each_header(tmp_path):
    # A row with one cell more than its header shifts every later column under the wrong name.
    text = report.write(_records(), _scenario(), tmp_path, 3, ["tessel bench ddp"])
    table = [ln for ln in text.splitlines() if ln.startswith("| model | strategy |")]
    rows = text.split(table[0])[1].split("\n\n")[0].strip().splitlines()[1:]
    width = table[0].count(" | ") + 1
    assert "| balanced link | efficiency |" in table[0] and rows
    assert all(row.count(" | ") + 1 == width for row in rows)


def test_write_report_plots_and_doc_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:ddp -->\nold numbers\n<!-- /bench:ddp -->\n\nkept text\n")
    text = report.write(_records(), _scenario(), tmp_path, 3, ["tessel bench ddp"], doc)
    assert "| lm | tessel-ddp | 2 | 1gbit | 3 | 125.0 (115.0–135.0) | 16% |" in text
    assert "| 2.00x (1.81–2.21) |" in text  # vs baseline, geometric mean over rounds (interval)
    new = doc.read_text()
    assert "old numbers" not in new and "kept text" in new and "![scaling](scaling.png)" in new
    for png in ("throughput.png", "bytes.png", "scaling.png"):
        assert (tmp_path / png).stat().st_size > 5000
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["commands"] == ["tessel bench ddp"] and len(saved["runs"]) == 18


def _compose_records():
    mib = 2**20
    # strategy -> (median step s, parameter+optimizer bytes per rank, bytes per step per channel)
    runs = {"ddp": (2.7, 48 * mib, {"dp.dense": 32 * mib, "meta": 14}),
            "pp8-async-predict": (2.0, 8 * mib, {"pp": 3 * mib, "meta": 0}),
            "tp8-3d": (5.2, 6 * mib, {"tp": 52 * mib, "tp.head": 2 * mib}),
            "dp2-pp2-tp2-1d": (1.8, 12 * mib, {"tp": 12 * mib, "dp.dense": 5 * mib, "pp": mib, "meta": 16}),
            "pp2-tp4-3d": (5.3, 6 * mib, {"tp": 48 * mib, "pp": mib / 2, "tp.head": 1.5 * mib}),
            "pp2-tp4-3d-async-predict": (4.0, 6 * mib, {"tp": 47 * mib, "pp": mib / 2})}
    recs = []
    for rep, jitter in enumerate([0.0, 0.1, -0.1]):
        for strategy, (step, state, sent) in runs.items():
            rec = _run("transformer_lm", strategy, 8, "200mbit", rep, step + jitter, sum(sent.values()))
            recs.append({**rec, "bytes_per_step": sent, "state_mem": state + rep})
    return recs


def test_compose_table_memory_ratio_and_fastest():
    summary = {"steps_run": 8, "bytes": {}, "median_step_time": 1.0, "median_tokens_per_s": 1.0, "unit": "tokens",
               "final_loss": 1.0, "state_mem_per_rank": [3, 7, 5]}
    assert runner._record(summary)["state_mem"] == 7
    scn = scenarios.get("compose")
    scn.rates = ["200mbit"]
    rows = report.aggregate(_compose_records(), scn)
    assert {r["strategy"]: r["state_mem"] for r in rows}["ddp"] == 48 * 2**20 + 2  # largest over repeats
    text = report.markdown(rows, scn, report.environment(scn, 3), ["tessel bench compose"])
    table = compose_table(rows, scn)
    assert table and table in text
    # pp2-tp4: 6 MiB of parameters and optimizer state per rank against DDP's 48 MiB
    assert "| pp2-tp4-3d | 5300.0 (5200.0–5400.0) | 0.51x (0.49–0.53) | tp 48.00 MiB, tp.head 1.50 MiB, " \
           "pp 512.00 KiB | 6.00 MiB | 0.125 |" in table
    assert "| ddp | 2700.0 (2600.0–2800.0) | 1.00x (1.00–1.00) | dp.dense 32.00 MiB, meta 14 B | 48.00 MiB | 1.000 |" \
        in table
    # pp2-tp4-3d is slower than tp8-3d in every round, so that is no noise
    assert ("At 200mbit on 8 hosts the fastest is `dp2-pp2-tp2-1d` (1800.0 ms), a composed plan; slower than the "
            "slowest single axis (`tp8-3d`, 5200.0 ms): `pp2-tp4-3d` (5300.0 ms).") in table
    # rounds that cross (5.25/5.2, 5.05/5.3, 5.4/5.1): a slower median within the paired interval is noise
    crossing = [{**r, "step_time": (5.25, 5.05, 5.4)[r["repeat"]]} if r["strategy"] == "pp2-tp4-3d" else r
                for r in _compose_records()]
    assert "`pp2-tp4-3d` (5250.0 ms, within noise)" in compose_table(report.aggregate(crossing, scn), scn)
    assert compose_table(rows, _scenario()) == ""  # other scenarios get no compose table


def test_bench_cli_errors(tmp_path, capsys):
    assert main(["bench", "nosuch"]) == 2
    assert "valid: ddp, sparse" in capsys.readouterr().err
    assert main(["bench", "ddp", "--models", "resnet"]) == 2
    assert "valid: transformer_lm, lstm_lm, classifier" in capsys.readouterr().err
    assert main(["bench", "ddp", "--report-only", "--out", str(tmp_path)]) == 2
    assert "run the benchmark first" in capsys.readouterr().err
    for bad in ("nan", "5", "inf"):
        assert main(["bench", "drift", "--seconds", bad, "--out", str(tmp_path)]) == 2
        assert "--seconds" in capsys.readouterr().err


def test_drift_floor_on_a_machine_that_halves_its_speed():
    # ten windows at full speed, then twenty at half: 10 windows of work take 10 windows from window 0, 20 from
    # window 10, and 15 from window 5 (5 at full speed do half the work, 10 at half speed the rest)
    speeds = [1.0] * 10 + [0.5] * 20
    assert [drift.run_time(speeds, s, 10.0) for s in (0, 5, 10)] == [10.0, 15.0, 20.0]
    f = drift.floor(speeds, run_s=10 * drift.WINDOW_S, trials=400)
    assert 0 < f.median <= (20 - 10) / 10 and f.p90 <= (20 - 10) / 10  # never beyond slowest over fastest
    assert f.share_over_5 > 0.5  # most triples start in different halves
    steady = drift.floor([1.0] * 40, run_s=5 * drift.WINDOW_S, trials=50)
    assert (steady.median, steady.p90, steady.share_over_5) == (0.0, 0.0, 0.0)
    text = "\n".join(drift.summary(speeds, 3, 1.0, 2, [0.5], per_core=[1.0, 0.83]))
    assert "67% of windows below 0.8" in text and "0.03 s of 2 CPU-s" in text
    assert "each core over the fastest's: 1.00, 0.83." in text


class _FakeCluster:
    """Stands in for EmulatedCluster: each 'run' writes the summary a tessel train run would, with a stage cut
    from a profile that differs from run to run unless --pipeline.split is given."""

    log: list = []

    def __init__(self, hosts, rate=None, prefix="", **cpu):
        self.hosts, self.rate, self.cpu = hosts, rate, cpu
        _FakeCluster.log.append(("up", hosts, cpu))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _FakeCluster.log.append(("down", self.hosts))

    def set_rate(self, rate):
        self.rate = rate
        _FakeCluster.log.append(("rate", rate))

    def torchrun_commands(self, args, run_id):
        return [args] * self.hosts

    def run(self, commands, timeout):
        args = commands[0]
        out = args[args.index("--out") + 1]
        split = runner._flag(args, "--pipeline.split")
        profiled = [[3, 3, 2, 2], [2, 3, 3, 2]][len(_FakeCluster.log) % 2]  # a noisy profile cuts differently
        counts = [int(c) for c in split.split(",")] if split else profiled
        edges = [sum(counts[:i]) for i in range(len(counts) + 1)]
        pp = runner._flag(args, "--pp")
        summary = {"steps_run": 5, "bytes": {}, "median_step_time": 0.1, "median_tokens_per_s": 1.0,
                   "unit": "samples", "final_loss": 1.0,
                   "pipeline": {"plan_bounds": list(zip(edges, edges[1:]))} if pp != "1" else None}
        Path(out).mkdir(parents=True)
        (Path(out) / "summary.json").write_text(json.dumps(summary))
        _FakeCluster.log.append(("run", self.rate, split))


def test_rounds_alternate_rates_and_pipelined_runs_share_one_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "EmulatedCluster", _FakeCluster)
    _FakeCluster.log = []
    scn = scenarios.get("pipeline")
    scn.models = {"classifier": scn.models["classifier"]}
    scn.strategies = {k: scn.strategies[k] for k in ("ddp", "torch-1f1b", "1f1b", "async-predict")}
    scn.rates, scn.unshaped, scn.cluster = ["1gbit", "200mbit"], True, {"period_us": 20000}
    records = runner.run_scenario(scn, tmp_path, repeats=3, log=lambda m: None)
    assert len(records) == 3 * 3 * 4  # rounds x (unshaped + 2 rates) x strategies
    assert _FakeCluster.log[0] == ("up", 4, {"period_us": 20000}) and _FakeCluster.log[-1] == ("down", 4)
    # one set of hosts; every round plays each rate once (the second round in reverse), links re-shaped in place
    assert [e[1] for e in _FakeCluster.log if e[0] == "rate"] == ["1gbit", "200mbit", "1gbit", None, "1gbit",
                                                                  "200mbit"]
    order = [(e[1]) for e in _FakeCluster.log if e[0] == "run"]
    assert order[:12] == [None] * 4 + ["1gbit"] * 4 + ["200mbit"] * 4 and order[12:24] == order[:12][::-1]
    staged = [r for r in records if r["strategy"] != "ddp"]
    assert len({tuple(map(tuple, r["pipeline"]["plan_bounds"])) for r in staged}) == 1  # one cut for all
    given = [e[2] for e in _FakeCluster.log if e[0] == "run"]
    assert given.count(None) == 1 + 9  # the first pipelined run profiles; ddp (pp 1) is never given a split
    first = runner.split_of({"pipeline": staged[0]["pipeline"]})
    assert set(given) - {None} == {first}


def test_compute_only_adds_unshaped_runs_to_a_scenario_without_them(tmp_path, monkeypatch):
    """--compute-only: the pipeline scenario (no unshaped runs by default) gets its compute-only time, hence its
    balanced link and efficiency."""
    monkeypatch.setattr(runner, "EmulatedCluster", _FakeCluster)
    monkeypatch.setattr(bench_cli, "_check_extras", lambda: None)
    _FakeCluster.log = []
    assert not scenarios.get("pipeline").unshaped
    argv = ["bench", "pipeline", "--models", "classifier", "--strategies", "1f1b,async-predict", "--rates", "50mbit",
            "--repeats", "1", "--compute-only", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert [e[1] for e in _FakeCluster.log if e[0] == "run"] == [None, None, "50mbit", "50mbit"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert {r["rate"] for r in saved["runs"]} == {"unshaped", "50mbit"}
    assert [r["compute_only"] for r in saved["rows"]] == [0.1, 0.1]  # each 50mbit row carries its compute-only


class _FailingCluster(_FakeCluster):
    """A fake cluster on which every async-predict run fails on host 1, as a crashed worker does."""

    def run(self, commands, timeout):
        args = commands[0]
        if "async-predict" in args:
            results = [HostResult(i, args, 1 if i == 1 else -15, "", f"Traceback ...\nRuntimeError: boom on host {i}\n"
                                  "=====", 1.0) for i in range(self.hosts)]
            raise HostFailed("host 1 (tslb-h1) exited with code 1; the other hosts were stopped: =====", 1, 1, results)
        return super().run(commands, timeout)


def test_a_failed_run_keeps_each_hosts_stderr_and_the_round_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "EmulatedCluster", _FailingCluster)
    _FakeCluster.log = []
    scn = scenarios.get("pipeline")
    scn.models = {"classifier": scn.models["classifier"]}
    scn.strategies = {k: scn.strategies[k] for k in ("ddp", "async-predict")}
    scn.rates, scn.unshaped = ["1gbit"], False
    said: list[str] = []
    records = runner.run_scenario(scn, tmp_path, repeats=2, log=said.append)
    assert [r["strategy"] for r in records] == ["ddp", "ddp"]  # the failed runs are left out, the others kept
    failed = tmp_path / "runs" / "classifier-async-predict-h4-1gbit-r0"
    assert "RuntimeError: boom on host 1" in (failed / "host1.stderr").read_text()
    assert any("FAILED" in line and str(failed) in line for line in said)


def test_pipeline_waits_per_stage_by_neighbour():
    """Each stage's bubble and receive waits are medians over runs, reported in stage order (ranks may hold
    stages in any order); torch's schedules, which cannot time their stages, get no rows."""
    runs = [{"schedule": "async-predict", "micro_batches": 1, "plan_bounds": [[0, 1], [1, 2]],
             "stage_of_rank": [1, 0], "bubble_per_rank": [0.4, 0.2], "wait_activation_per_rank": [0.030, 0.0],
             "wait_grad_per_rank": [0.0, 0.010]},
            {"schedule": "async-predict", "micro_batches": 1, "plan_bounds": [[0, 1], [1, 2]],
             "stage_of_rank": [0, 1], "bubble_per_rank": [0.1, 0.6], "wait_activation_per_rank": [0.0, 0.050],
             "wait_grad_per_rank": [0.020, 0.0]}]
    mine = {"model": "m", "rate": "1gbit", "strategy": "async-predict", "pipeline": report._pipeline_stats(runs)}
    torch_runs = [{**r, "schedule": "torch-1f1b", "bubble_per_rank": [None, None],
                   "wait_activation_per_rank": [None, None], "wait_grad_per_rank": [None, None]} for r in runs]
    peer = {"model": "m", "rate": "1gbit", "strategy": "torch-1f1b", "pipeline": report._pipeline_stats(torch_runs)}
    text = report.wait_table([mine, peer])
    # stage 0: bubbles 0.2 and 0.1 -> 15%; waits on the next stage 10 and 20 ms -> 15.0
    assert "| m | 1gbit | async-predict | 0 | 15% | 0.0 | 15.0 |" in text
    assert "| m | 1gbit | async-predict | 1 | 50% | 40.0 | 0.0 |" in text
    assert "torch-1f1b" not in text and mine["pipeline"]["regime"] == "async, s ≤ 1 (2 stages, 1 micro-batch)"


def test_spread_from_step_jitter_tells_jittery_steps_from_runs_that_moved(tmp_path):
    # runs that are steady inside but sit apart: all of their spread is the runs moving as a whole
    assert stats.jitter_spread([[0.10] * 8, [0.12] * 8, [0.11] * 8]) == 0.0
    # every run the same jittery sequence: its medians agree, but redrawn steps would not; the pooled steps
    # are 1/2 and 3/2 of the median, half each, so a redrawn run of 6 steps has median 1/2, 1 or 3/2
    jittery = stats.jitter_spread([[0.05, 0.15] * 3] * 3, trials=400)
    assert 0.5 <= jittery <= 1.0
    assert stats.jitter_spread([[0.1] * 6]) is None and stats.jitter_spread([None, None]) is None
    assert stats.jitter_spread([[0.1] * 6, [0.1] * 4]) is None  # 4 timed steps: too few to say
    # records saved before they carried step times get those of their run's metrics.jsonl (after warm-up)
    run = tmp_path / "runs" / "lm-ddp-h4-1gbit-r0"
    run.mkdir(parents=True)
    run.joinpath("metrics.jsonl").write_text("".join(json.dumps({"step": i, "step_time": t}) + "\n"
                                                     for i, t in enumerate([9.0, 9.0, 9.0, 0.1, 0.2, 0.3], 1)))
    recs = [_run("lm", "ddp", 4, "1gbit", 0, 0.2), _run("lm", "ddp", 4, "1gbit", 1, 0.2)]
    runner.fill_step_times(recs, tmp_path)
    assert recs[0]["step_times"] == [0.1, 0.2, 0.3] and recs[1].get("step_times") is None


def test_soak_slope_recovers_growth_and_calls_flat_runs_flat():
    """The soak's fit on synthetic RSS series: a known growth is recovered inside its interval; a plateau with
    steps and noise (an allocator pool that grows once, then is reused) has an interval that includes 0."""
    import numpy as np

    from tessel.bench import soak

    rng = np.random.default_rng(0)
    steps = np.arange(1000, 5000, 20)
    growing = 400 + 0.05 * steps + rng.normal(0, 3, steps.size)  # 0.05 MB a step
    b, lo, hi = soak.slope(steps, growing)
    assert lo < 0.05 < hi and hi - lo < 0.01
    assert soak.verdict({"slope": b, "low": lo, "high": hi}) == "grows"
    plateau = 420 + 8 * (steps > 2000) - 8 * (steps > 3500) + rng.normal(0, 3, steps.size)  # no trend
    b, lo, hi = soak.slope(steps, plateau)
    assert soak.verdict({"slope": b, "low": lo, "high": hi}).startswith("flat")
    small = 420 + 0.002 * steps + rng.normal(0, 1, steps.size)  # 0.002 MB a step: 200 MB per 100,000 steps
    b, lo, hi = soak.slope(steps, small)
    assert lo > 0 and soak.verdict({"slope": b, "low": lo, "high": hi}) == "flat (under 0.01 MB/step)"


def test_soak_fit_skips_warm_up_and_reads_the_step(tmp_path):
    from tessel.bench import soak

    samples = [(s, [int(300e6 + (50e6 if s < 200 else 0) + s * 1e4), None]) for s in range(0, 1000, 10)]
    (host0, host1) = soak.fit(samples, steps=1000)
    assert host0["first_step"] > 200 and abs(host0["slope"] - 0.01) < 1e-9  # 1e4 bytes a step = 0.01 MB
    assert host1 == {"host": 1, "samples": 0}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(1, 8)) + '{"step": 8, "lo')
    assert soak.last_step(metrics) == 7  # a line being written is skipped
    assert soak.last_step(tmp_path / "none.jsonl") is None


def test_soak_fits_every_rank_s_allocator_bytes_from_its_own_file(tmp_path):
    """The logging rank's heap is in metrics.jsonl, every other rank's in memory-rank<r>.jsonl; the table puts each
    beside the host of that index, labelled with its rank (hosts need not take ranks in order)."""
    from tessel.bench import soak

    def write(name, per_step):
        (tmp_path / name).write_text("".join(json.dumps({"step": s, "rss": 1, "heap": int(100e6 + per_step * s)})
                                             + "\n" for s in range(10, 1000, 10)))

    write("metrics.jsonl", 0)
    write("memory-rank1.jsonl", 2e4)  # 0.02 MB a step
    heaps = soak.heap_fits(tmp_path, 3, 1000)
    assert abs(heaps[0]["slope"]) < 1e-9 and abs(heaps[1]["slope"] - 0.02) < 1e-9 and heaps[2] is None
    samples = [(st, [int(400e6), int(400e6)]) for st in range(0, 1000, 10)]
    rows = soak.table([{"strategy": "dense", "hosts": soak.fit(samples, 1000), "heaps": heaps[:2]}])
    assert "rank 0: +0.00000" in rows[2] and "rank 1: +0.02000" in rows[3], rows
    # the verdict is on the anonymous resident set where it was sampled: file pages come and go with the page cache
    anon = [(st, [int(100e6 + 3e4 * st), int(100e6)]) for st in range(0, 1000, 10)]
    rows = soak.table([{"strategy": "dense", "hosts": soak.fit(samples, 1000), "anon": soak.fit(anon, 1000)}])
    assert rows[2].endswith("| grows |") and "+0.03000" in rows[2]
    assert rows[3].endswith("| flat (interval includes 0) |")
    me = os.getpid()
    assert 0 < soak.anon_bytes(me) < soak.rss_bytes(me) and soak.anon_bytes(2**22 + 7) is None


def test_soak_report_only_runs_nothing_and_append_keeps_the_strategies_it_does_not_redo(tmp_path, monkeypatch):
    """--report-only renders the saved runs without building a cluster (which would tear down a soak running under
    the same prefix); --append runs only the strategies asked and keeps the rest, in the soak's order."""
    from tessel.bench import soak

    def row(strategy, grow):
        samples = [(st, [int(400e6 + grow * st), int(400e6)]) for st in range(0, 1000, 10)]
        return {"strategy": strategy, "flags": [], "seconds": 1.0, "samples": samples,
                "hosts": soak.fit(samples, 1000), "heap": None}

    saved = {"steps": 1000, "hosts": 2, "rate": "1gbit", "runs": [row("dense", 0), row("ps", 2e5)]}
    (tmp_path / "results.json").write_text(json.dumps(saved))

    class NoCluster:
        def __init__(self, *a, **k):
            raise AssertionError("a cluster was built")

    monkeypatch.setattr("tessel.cluster.emulate.EmulatedCluster", NoCluster)
    assert main(["bench", "soak", "--report-only", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| ps | 0 |" in report and "grows" in report and "| dense | 1 |" in report

    class FakeCluster:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("tessel.cluster.emulate.EmulatedCluster", FakeCluster)
    monkeypatch.setattr(soak, "run", lambda strategy, *a: row(strategy, 1e3))
    assert main(["bench", "soak", "--strategies", "alltoall,dense", "--steps", "1000", "--append", "--out",
                 str(tmp_path)]) == 0
    now = json.loads((tmp_path / "results.json").read_text())
    assert [r["strategy"] for r in now["runs"]] == ["dense", "ps", "alltoall"] and now["kept"] == ["ps"]
    assert now["runs"][1] == json.loads(json.dumps(saved["runs"][1]))  # ps as it was
    assert "The runs of ps are kept from an earlier invocation" in (tmp_path / "report.md").read_text()


def test_report_only_keeps_the_baseline_and_rates_the_run_had(tmp_path):
    """A --strategies run without the scenario's baseline (sparse without dense) at a rate the scenario does not list
    (50mbit) renders again as it first did: the first strategy that ran is the baseline, and the rate's rows are in
    the report and its bytes plot."""
    recs = []
    for rep in range(3):
        for rate, step in (("unshaped", 0.1), ("50mbit", 0.4)):
            recs += [_run("lstm_lm", "torch-sparse", 2, rate, rep, step * 1.2),
                     _run("lstm_lm", "ps", 2, rate, rep, step, 1e6)]
    (tmp_path / "results.json").write_text(json.dumps({"runs": recs, "commands": [], "environment": {}}))
    assert main(["bench", "sparse", "--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "Baseline for ratios: `torch-sparse`" in text, text
    assert "| lstm_lm | ps | 2 | 50mbit | 3 | 400.0 (400.0–400.0) |" in text and "| 1.20x (1.20–1.20) |" in text, text
    assert (tmp_path / "bytes.png").stat().st_size > 5000  # ps's bytes at 50mbit are drawn


def test_a_cluster_a_live_process_holds_is_not_torn_down(tmp_path, monkeypatch):
    """up() of a prefix whose state file names a live owner (another benchmark) refuses in one line, before
    touching anything; a dead owner's cluster is a leftover as before."""
    import subprocess
    import sys

    from tessel.cluster import housekeeping
    from tessel.cluster.emulate import EmulatedCluster
    from tessel.cluster.housekeeping import ClusterError

    monkeypatch.setattr(housekeeping, "STATE_DIR", tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        housekeeping.state_file("tslheld").write_text(json.dumps({"hosts": 2, "owner": holder.pid}))
        with pytest.raises(ClusterError) as e:
            EmulatedCluster(2, prefix="tslheld").up()
        assert f"emulated cluster 'tslheld' is in use by pid {holder.pid} (" in str(e.value)
        assert "\n" not in str(e.value) and housekeeping.state_file("tslheld").exists()
    finally:
        holder.kill()
        holder.wait()
    assert housekeeping.held_by("tslheld") is None


def test_a_strategy_no_count_covers_takes_the_bytes_its_hosts_interfaces_sent():
    """torch's sparse DDP sends through its own reducer: no counted strategy moves its bytes, so its bound and
    efficiency rest on what the busiest host's interface sent (marked "(wire)"); a counted strategy keeps its
    count, its wire figure shown beside it."""
    scn = scenarios.get("sparse")
    scn.models, scn.hosts, scn.rates = {"lm": []}, [2], ["1gbit"]
    recs = []
    for rep in range(3):
        for rate, step in (("unshaped", 0.05), ("1gbit", 0.2)):
            recs += [_run("lm", "dense", 2, rate, rep, step * 2, 25e6),
                     {**_run("lm", "torch-sparse", 2, rate, rep, step), "max_rank_sent_per_step": 0.0,
                      "wire_max_host_per_step": 12.5e6 * (1 + 0.01 * rep)},
                     {**_run("lm", "ps", 2, rate, rep, step, 5e6), "wire_max_host_per_step": 5.1e6}]
    rows = {(r["strategy"], r["rate"]): r for r in report.aggregate(recs, scn)}
    theirs, ps = rows[("torch-sparse", "1gbit")], rows[("ps", "1gbit")]
    assert theirs["sent_per_step_max_rank"] == pytest.approx(12.625e6) and theirs["sent_on_wire"]
    assert theirs["comm_bound"] == pytest.approx(12.625e6 * 8 / 1e9)
    assert theirs["efficiency"] is not None
    assert ps["sent_per_step_max_rank"] == 5e6 and not ps["sent_on_wire"]
    assert ps["wire_per_step_max_host"] == pytest.approx(5.1e6)
    text = report.markdown(list(rows.values()), scn, report.environment(scn, 3), ["tessel bench sparse"])
    assert "wire/step busiest host" in text and "12.04 MiB (wire)" in text, text


def test_where_the_tables_time_goes_is_the_median_of_each_wait_over_runs():
    """The overlap scenario's tables-time table: each kind of wait's median over runs (a run that never waited for
    late rows counts 0 there), their sum and the tables' own work, one row per shaped cell."""
    scn = scenarios.get("overlap")
    scn.models, scn.hosts, scn.rates = {"lm": []}, [2], ["50mbit"]
    recs = []
    for rep in range(3):
        late = {"late_rows": 0.010 * (rep + 1)} if rep else {}  # the first run waited for no late rows
        for rate in ("unshaped", "50mbit"):
            recs += [{**_run("lm", "alltoall", 2, rate, rep, 0.2), "sparse_comm": 0.1, "sparse_hidden": 0.5,
                      "sparse_waits": {"ids": 0.001, "rows": 0.004 + 0.001 * rep, "grads": 0.002, **late},
                      "sparse_work": 0.003},
                     {**_run("lm", "alltoall-unsched", 2, rate, rep, 0.25), "sparse_comm": 0.08,
                      "sparse_hidden": 0.0, "sparse_waits": {"ids": 0.01, "rows": 0.03, "grads": 0.04},
                      "sparse_work": 0.002},
                     # ps tables run no collective on the clock: their runs record it empty
                     {**_run("lm", "ps", 2, rate, rep, 0.25), "sparse_comm": 0.0, "sparse_hidden": None,
                      "sparse_waits": dict.fromkeys(("ids", "rows", "late_rows", "grads"), 0.0), "sparse_work": 0.0}]
    rows = report.aggregate(recs, scn)
    text = report.tables_time_table(rows)
    lines = [ln for ln in text.splitlines() if ln.startswith("| lm |")]
    # ids, rows, late rows (median of 0, 20, 30 ms), grads, their sum, own work
    assert "| lm | alltoall | 2 | 50mbit | 200.0 | 100.0 | 1.0 | 5.0 | 20.0 | 2.0 | 28.0 | 3.0 |" in lines, text
    assert "| lm | alltoall-unsched | 2 | 50mbit | 250.0 | 80.0 | 10.0 | 30.0 | 0.0 | 40.0 | 80.0 | 2.0 |" in lines
    assert len(lines) == 2  # compute-only runs feed other columns, not rows here; ps has no row


def test_every_scenario_cell_is_a_valid_train_command_line():
    """Each benchmark cell's flags (common, model, strategy) parse and validate as `tessel train` would take them,
    so a scenario cannot ship a flag or value that fails only when its cell is reached hours into a run."""
    from tessel.bench.scenarios import SCENARIOS
    from tessel.cli import config_from_args, parser

    for scn in SCENARIOS.values():
        for model, flags in scn.models.items():
            for strategy, extra in scn.strategies.items():
                ns = parser().parse_args(["train", *scn.common, *flags, *extra])
                cfg = config_from_args(ns)
                assert cfg.model.name, (scn.name, model, strategy)


def _judged_rows() -> list[dict]:
    """Two cells of a plan check, 3 rounds each: cell a's pick 1.104x its best in every round (a miss), b's the
    best."""
    def row(model, rank, predicted, times):
        return {"model": model, "hosts": 4, "rate": "1gbit", "rank": rank, "plan": f"plan{rank}",
                "predicted": predicted, "compute": predicted, "comm": 0.0, "bubble": 0.0,
                "measured": statistics.median(times), "runs": times, "rounds": dict(enumerate(times)),
                "planning_s": 1.0, "bytes_predicted": {}, "bytes_measured": {}}

    return [row("a", 1, 0.10, [0.1104, 0.1126, 0.1082]), row("a", 2, 0.11, [0.100, 0.102, 0.098]),
            row("b", 1, 0.10, [0.100, 0.102, 0.098]), row("b", 2, 0.11, [0.120, 0.121, 0.119])]


def test_the_pick_is_judged_against_ten_percent_by_its_paired_interval():
    """1.104x slower in every round: a miss (the interval excludes 1.10), though it prints as 1.10x; rounds that
    straddle 1.10 are not distinguishable; one round is judged on its point and says so. The headline counts
    each verdict over the cells."""
    best = {0: 0.100, 1: 0.102, 2: 0.098}
    ratio, verdict = plan_check.judge_pick({r: t * 1.104 for r, t in best.items()}, best)
    assert verdict == "miss" and f"{ratio.value:.2f}" == "1.10" and ratio.low > 1.10
    assert plan_check.judge_pick({0: 0.102, 1: 0.120, 2: 0.108}, best)[1] == "not distinguishable"
    assert plan_check.judge_pick({0: 0.101, 1: 0.104, 2: 0.099}, best)[1] == "within"
    assert plan_check.judge_pick({0: 0.1104}, {0: 0.1})[1] == "miss (1 round)"

    rows = _judged_rows()
    text = plan_check.markdown(rows, "tessel bench plan")
    assert "1 within, 1 miss, of 2 cells" in text
    assert "| a, 4 hosts, 1gbit | 2 of 2 |" in text and "1.10x (1.10–1.10): miss |" in text
    before = plan_check.markdown(rows, "tessel bench plan", ("tessel bench plan --repeats 3", rows[2:]))
    assert "The previous run (`tessel bench plan --repeats 3`): median absolute error" in before
    assert "1 within, of 1 cells." in before


def test_plan_report_gives_the_cells_own_floor_from_half_its_rounds_against_the_other_half():
    """With 4 rounds or more a cell's report adds what a perfect predictor scores there: each candidate's median
    over rounds 0, 2, ... as the prediction of its median over rounds 1, 3, ...; with 3 rounds (cells a and b of
    the fixture) it cannot, and says nothing."""
    assert "own floor" not in plan_check.markdown(_judged_rows(), "tessel bench plan")
    rows = [*_judged_rows()[:2], {**_judged_rows()[3], "model": "a", "rank": 3}]
    rows[0]["rounds"] = {0: 0.110, 1: 0.121, 2: 0.112, 3: 0.121, 4: 0.114, 5: 0.121}  # halves 0.112 and 0.121
    rows[1]["rounds"] = {0: 0.100, 1: 0.090, 2: 0.100, 3: 0.095, 4: 0.101, 5: 0.090}  # halves 0.100 and 0.090
    rows[2]["rounds"] = {k: 0.200 for k in range(6)}  # halves 0.200 and 0.200; the order kept in both halves
    errors = sorted([abs(0.112 - 0.121) / 0.121, abs(0.100 - 0.090) / 0.090, 0.0])
    text = plan_check.markdown(rows, "tessel bench plan --repeats 6")
    row = f"| a, 4 hosts, 1gbit | {errors[1]:.0%} | {errors[2]:.0%} | 1.00 |"
    assert "own floor" in text and row in text, text
    saved = json.loads(json.dumps(rows))  # as results.json keeps them: the rounds' keys are strings
    assert row in plan_check.markdown(saved, "tessel bench plan --repeats 6")
    rows[1]["rounds"] = {0: 0.100, 1: 0.090, 2: 0.100}  # one candidate with 3 rounds: no floor for the cell
    assert "own floor" not in plan_check.markdown(rows, "tessel bench plan")


def test_bench_plan_keeps_the_previous_run_beside_the_new_one(tmp_path, monkeypatch, capsys):
    """A second `tessel bench plan` into the same folder moves the first's results.json to results-previous.json
    (not overwritten, not deleted) and prints the first's headline under the new one's."""
    rows = _judged_rows()
    runs = iter([rows[2:], rows])  # the first invocation measured one cell, the second both
    monkeypatch.setattr(plan_check, "run", lambda *a, **kw: next(runs))
    monkeypatch.setattr(plan_check, "scatter", lambda rows, path: path)
    argv = ["bench", "plan", "--models", "classifier", "--repeats", "3", "--out", str(tmp_path)]
    assert main(argv) == 0
    first = json.loads((tmp_path / "results.json").read_text())
    capsys.readouterr()
    assert main(argv) == 0
    assert json.loads((tmp_path / plan_check.PREVIOUS).read_text()) == first
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == json.loads(json.dumps(rows))
    printed = capsys.readouterr().out
    assert "1 within, 1 miss, of 2 cells" in printed and "The previous run (`tessel bench plan" in printed
    assert "1 within, of 1 cells." in printed


def test_memory_search_brackets_the_largest_depth_from_the_hosts_peaks(monkeypatch, tmp_path):
    """``tessel bench memory``'s search on hosts faked to hold 10 MiB a layer over 300: it extrapolates the two
    deepest fits' peaks to the limit, stays inside the bracket, and stops only once the deepest fit's next depth
    failed; a planner that refuses is a failure without a run."""
    from tessel.bench import fit

    mib = 2**20
    monkeypatch.setattr(fit, "params_of", lambda layers: layers * 1000)
    tried = []

    def fake_run(emu, args, where):
        depth = int(args[args.index("--model.layers") + 1])
        tried.append(depth)
        peak = (300 + 10 * depth) * mib
        return {"fits": peak <= fit.LIMIT, "oom": peak > fit.LIMIT, "host_peak": min(peak, fit.LIMIT),
                "measured": 10 * depth * mib, "predicted": [10 * depth * mib]}

    monkeypatch.setattr(fit, "_run", fake_run)
    found = fit.search("fsdp", None, tmp_path, None, lambda msg: None)
    largest = (fit.LIMIT // mib - 300) // 10  # 14 at 448 MiB
    assert found["largest"] == largest and found["bracketed"] and found["params"] == largest * 1000
    assert tried[:2] == [2, 4] and tried[-2:] in ([largest, largest + 1], [largest + 1, largest])
    assert len(tried) <= 5, tried  # the line through two fits lands on the limit: no walk one depth at a time
    monkeypatch.setattr(fit, "_plan", lambda layers, budget, where: (None, "no plan fits") if layers > 3
                        else (tmp_path / "p.json", {"dp": 8}))
    tried.clear()
    planned = fit.search("planner", None, tmp_path, 100 * mib, lambda msg: None)
    assert planned["largest"] == 3 and planned["bracketed"] and tried == [2, 3]
    assert [r.get("refused") for r in planned["runs"]] == [None, "no plan fits", None]
    # a pick that fails below the line its peaks draw (it changed with the depth): halfway into the bracket
    monkeypatch.setattr(fit, "_plan", lambda layers, budget, where: (tmp_path / "p.json", {"dp": 8}))
    monkeypatch.setattr(fit, "_run", lambda emu, args, where: tried.append(d := int(
        args[args.index("--model.layers") + 1])) or {"fits": d <= 30, "oom": d > 30, "host_peak": (300 + 4 * d) * mib})
    tried.clear()
    planned = fit.search("planner", None, tmp_path, 100 * mib, lambda msg: None)
    assert planned["largest"] == 30 and planned["bracketed"] and tried == [2, 4, 32, 18, 25, 28, 30, 31], tried
    # and one whose peak fell as the depth grew (a leaner pick) doubles rather than extrapolate a line
    peaks = {2: 430, 4: 420}
    monkeypatch.setattr(fit, "_run", lambda emu, args, where: tried.append(d := int(
        args[args.index("--model.layers") + 1])) or {"fits": d <= 12, "oom": d > 12,
                                                      "host_peak": peaks.get(d, 440) * mib})
    tried.clear()
    planned = fit.search("planner", None, tmp_path, 100 * mib, lambda msg: None)
    assert tried[:3] == [2, 4, 8] and planned["largest"] == 12 and planned["bracketed"], tried


def test_memory_budget_is_the_limit_less_what_any_run_held_beside_tensors_and_units(monkeypatch, tmp_path):
    """The planner's budget in ``tessel bench memory``: the limit less the most any earlier run's host held beside
    its measured tensors and its FSDP units (0.68 MiB each on the CPU: the units the planner prices itself),
    taken again before each try from the runs so far."""
    from tessel.bench import fit
    from tessel.plan import ParallelPlan

    mib, unit = 2**20, 0.68 * 2**20
    fsdp = ParallelPlan(dp=8, dp_shard=8).to_dict()
    piped = ParallelPlan(dp=4, dp_shard=4, pp=2, bounds=((0, 9), (9, 25))).to_dict()
    runs = [{"layers": 5, "fits": True, "plan": ParallelPlan(dp=8).to_dict(), "host_peak": 443 * mib,
             "measured": 70 * mib},
            {"layers": 23, "fits": True, "plan": fsdp, "host_peak": 448 * mib, "measured": 58 * mib},
            {"layers": 23, "fits": True, "plan": piped, "host_peak": 440 * mib, "measured": 50 * mib},
            {"layers": 30, "fits": False, "oom": True, "host_peak": 448 * mib}]
    # units: 23 blocks + the embedding and the head, then the root; the pipeline's fuller stage: 16 chain layers + 1
    assert [fit.units_of(r) for r in runs[:3]] == [0, 26, 17]
    assert [round(fit.beside(r) / mib, 2) for r in runs[:3]] == [373.0, round(390 - 26 * 0.68, 2),
                                                                  round(390 - 17 * 0.68, 2)]
    # the pipeline's 390 - 11.56 = 378.44 MiB is the most once the units are priced (the FSDP run's 390 MiB beside
    # its tensors is 372.3 beside its units too); a run that did not train counts nothing
    assert fit.overhead(runs) == int(440 * mib - 50 * mib - 17 * unit)
    budgets = []
    monkeypatch.setattr(fit, "_plan", lambda layers, budget, where: budgets.append(budget) or (None, "refused"))
    fit.search("planner", None, tmp_path, None, lambda msg: None, evidence=runs)
    assert budgets and set(budgets) == {fit.LIMIT - int(440 * mib - 50 * mib - 17 * unit)}  # (every try refused)


def test_memory_timing_only_keeps_the_searches_and_times_the_named_plans_again(monkeypatch, tmp_path):
    """``tessel bench memory --timing-only``: the saved searches and depth are kept, only the plans named are
    timed again (rounds in alternating order), and the report says which were timed; elsewhere it is refused."""
    import argparse
    import contextlib
    import json

    from tessel.bench import cli, fit
    from tessel.cluster import emulate
    from tessel.errors import ConfigError

    found = [{"strategy": s, "largest": d, "params": d * 1000, "runs": [{"layers": d, "fits": True, "measured": 1,
                                                                         "predicted": [1], "host_peak": 2}]}
             for s, d in (("ddp", 5), ("fsdp", 23), ("planner", 36))]
    (tmp_path / "results.json").write_text(json.dumps({"found": found, "timed": [], "depth": 5, "budget": 7,
                                                       "argv": []}))
    order = []

    def fake_run(emu, args, where):
        order.append(where.name)
        return {"fits": True, "step_time": 1.0 if "ddp" in where.name else 1.02, "measured": 1, "predicted": [1]}

    monkeypatch.setattr(fit, "_run", fake_run)
    monkeypatch.setattr(fit, "_plan", lambda layers, budget, where: (where / "plan.json", {"dp": 8}))
    monkeypatch.setattr(emulate, "EmulatedCluster", lambda *a, **k: contextlib.nullcontext())
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    ns = parser.parse_args(["bench", "memory", "--timing-only", "--strategies", "ddp,planner", "--repeats", "2",
                            "--out", str(tmp_path)])
    assert fit.main(ns, ["bench", "memory"], lambda out, doc: None) == 0
    assert order == ["time-ddp-l5-r0", "time-planner-l5-r0", "time-planner-l5-r1", "time-ddp-l5-r1"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["found"] == found and saved["depth"] == 5 and len(saved["timed"]) == 4
    report = (tmp_path / "report.md").read_text()
    assert "timed here: ddp, planner" in report and "| fsdp | 23 |" in report
    for bad in (["plan", "--timing-only"], ["memory", "--timing-only", "--report-only"]):
        with pytest.raises(ConfigError, match="--timing-only"):
            cli.main(parser.parse_args(["bench", *bad]), [])
    ns = parser.parse_args(["bench", "memory", "--timing-only", "--strategies", "fsdp-tp", "--out", str(tmp_path)])
    with pytest.raises(ConfigError, match="fsdp-tp not searched"):
        fit.main(ns, [], lambda out, doc: None)
    order.clear()  # without --strategies: every plan the file holds
    ns = parser.parse_args(["bench", "memory", "--timing-only", "--repeats", "1", "--out", str(tmp_path)])
    assert fit.main(ns, [], lambda out, doc: None) == 0
    assert order == [f"time-{s}-l5-r0" for s in ("ddp", "fsdp", "planner")]
    ns = parser.parse_args(["bench", "memory", "--timing-only", "--out", str(tmp_path / "none")])
    with pytest.raises(ConfigError, match="no saved search"):
        fit.main(ns, [], lambda out, doc: None)


def test_a_plan_check_row_compares_fsdps_bytes_too(tmp_path):
    """A candidate's row holds every exact channel, FSDP's gathers, reduce-scatters and replica sums among them, as
    predicted and as tessel.comm counted them (the busiest rank's bytes a step), so an FSDP plan whose count
    differs is not reported exact."""
    from types import SimpleNamespace

    from tessel.plan import ParallelPlan

    run = tmp_path / "runs" / "m-plan-h2-1gbit-r0"
    run.mkdir(parents=True)
    counted = {"dp.gather": 12 * 8, "dp.scatter": 5 * 8, "meta": 16}  # 8 steps' totals
    (run / "summary.json").write_text(json.dumps(
        {"steps_run": 8, "bytes": {c: {"sent_max_rank_total": v} for c, v in counted.items()}}))
    e = SimpleNamespace(plan=ParallelPlan(dp=2, dp_shard=2), step=0.1, compute=0.05, comm=0.05, bubble=0.0,
                        bytes={"dp.gather": 10.0, "dp.scatter": 5.0})
    row = plan_check._row("m", 2, "1gbit", 1, e, [{"step_time": 0.1, "repeat": 0}], tmp_path, "plan", 1.0)
    assert row["bytes_predicted"] == {"dp.dense": 0, "dp.gather": 10.0, "dp.replicate": 0, "dp.scatter": 5.0,
                                      "pp": 0, "tp": 0}
    assert row["bytes_measured"] == {"dp.dense": 0, "dp.gather": 12.0, "dp.replicate": 0, "dp.scatter": 5.0,
                                     "pp": 0, "tp": 0}
    assert row["bytes_predicted"] != {k: round(v) for k, v in row["bytes_measured"].items()}  # not exact
