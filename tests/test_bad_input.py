"""Bad input, table-driven: each case is one line ``tessel: error: ...`` and exit 2 before any worker starts.

Every float key refuses NaN and infinity (a NaN passes every ``<`` check, so ``--train.clip nan`` used to turn
clipping off silently); the rest are what the config alone cannot know: the torch build, the file system,
the environment, the machine's memory.
"""

import pytest

from tessel.cli import main

CASES = [
    (["train", "--lr", "nan"], "'train.lr' is nan; it must be a finite number"),
    (["train", "--parallel.timeout", "nan"], "'parallel.timeout' is nan"),
    (["train", "--parallel.timeout", "inf"], "'parallel.timeout' is inf"),
    (["train", "--train.clip", "nan"], "'train.clip' is nan"),
    (["train", "--train.momentum", "nan"], "'train.momentum' is nan"),
    (["train", "--sparse.max_touched", "nan"], "'sparse.max_touched' is nan"),
    (["train", "--sparse.link_mbit=-inf"], "'sparse.link_mbit' is -inf"),
    (["train", "--model.dropout", "nan"], "'model.dropout' is nan"),
    (["train", "--parallel.backend", "nccl"], "needs CUDA GPUs"),
    (["train", "--out", "{file}/sub"], "cannot be written"),
    (["train", "--model", "classifier", "--model.classes", "1e11"], "needs more memory than this machine has"),
    (["train", "--sparse.tables", "nosuch=ps"], "'nosuch', which is not a table of this model"),
    (["train", "--model", "resnet"], "model.name"),
    (["train", "--nproc", "3", "--dp", "2"], "world size 3"),
    (["train", "--max-restarts", "-1"], "give an integer >= 0"),
    (["bench", "ddp", "--out", "{file}"], "is a file"),
    (["bench", "ddp", "--report-only", "--out", "{folder}", "--doc", "{folder}/missing/bench.md"],
     "does not exist"),
    (["bench", "ddp", "--report-only", "--out", "{corrupt}"], "is not a results file tessel wrote"),
    (["cluster", "up", "--hosts", "2", "--cpus", "inf"], "cpus must be a finite number"),
    (["cluster", "up", "--hosts", "2", "--cpus", "nan"], "cpus must be a finite number"),
]


@pytest.mark.parametrize("argv,needle", CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_one_line_and_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "results.json").write_text("{not json")
    paths = {"file": tmp_path / "file", "folder": tmp_path, "corrupt": tmp_path / "corrupt"}
    argv = [a.format(**paths) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tessel: error: "), err
    assert needle in err, err


def test_link_rate_from_the_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TESSEL_LINK_MBIT", "fast")
    assert main(["train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("tessel: error: TESSEL_LINK_MBIT is 'fast'; it must be a positive number of Mbit/s, e.g. 200, "
                   "or unset (the rate is then measured)")
