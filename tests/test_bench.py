"""tessel bench's arithmetic: medians, the physical bound, efficiency, ratios, the doc section; no cluster."""

import json

import pytest

from tessel.bench import report, runner, scenarios
from tessel.bench.compose_tables import compose_table
from tessel.cli import main


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


def test_bound_efficiency_and_ratios():
    rows = {(r["strategy"], r["hosts"], r["rate"]): r for r in report.aggregate(_records(), _scenario())}
    assert ("tessel-ddp", 2, "unshaped") not in rows  # compute-only runs feed the bound, they are no rows
    mine = rows[("tessel-ddp", 2, "1gbit")]
    assert mine["step_time"] == {"median": 0.125, "min": 0.115, "max": 0.135}
    assert mine["compute_only"] == pytest.approx(0.06)
    assert mine["comm_bound"] == pytest.approx(0.1)  # 12.5e6 B * 8 / 1e9 bit/s
    assert mine["efficiency"] == pytest.approx(0.1 / 0.125)
    assert mine["vs_baseline"] == pytest.approx(0.25 / 0.125)
    # torch's own DDP is not counted; it is given the bytes of the strategy that moves the same ones
    theirs = rows[("torch-ddp", 2, "1gbit")]
    assert theirs["comm_bound"] == pytest.approx(0.1) and theirs["efficiency"] == pytest.approx(0.4)


def test_write_report_plots_and_doc_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:ddp -->\nold numbers\n<!-- /bench:ddp -->\n\nkept text\n")
    text = report.write(_records(), _scenario(), tmp_path, 3, ["tessel bench ddp"], doc)
    assert "| lm | tessel-ddp | 2 | 1gbit | 125.0 (115.0–135.0) |" in text and "| 0.80 |" in text
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
    assert "| pp2-tp4-3d | 5300.0 (5200.0–5400.0) | 0.51x | tp 48.00 MiB, tp.head 1.50 MiB, pp 512.00 KiB " \
           "| 6.00 MiB | 0.125 |" in table
    assert "| ddp | 2700.0 (2600.0–2800.0) | 1.00x | dp.dense 32.00 MiB, meta 14 B | 48.00 MiB | 1.000 |" in table
    assert ("At 200mbit on 8 hosts the fastest is `dp2-pp2-tp2-1d` (1800.0 ms), a composed plan; slower than the "
            "slowest single axis (`tp8-3d`, 5200.0 ms): `pp2-tp4-3d` (5300.0 ms, within noise).") in table
    assert compose_table(rows, _scenario()) == ""  # other scenarios get no compose table


def test_bench_cli_errors(tmp_path, capsys):
    assert main(["bench", "nosuch"]) == 2
    assert "valid: ddp, sparse" in capsys.readouterr().err
    assert main(["bench", "ddp", "--models", "resnet"]) == 2
    assert "valid: transformer_lm, lstm_lm, classifier" in capsys.readouterr().err
    assert main(["bench", "ddp", "--report-only", "--out", str(tmp_path)]) == 2
    assert "run the benchmark first" in capsys.readouterr().err
