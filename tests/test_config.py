"""Config: TOML + overrides, types, choices and bounds; every error names the key and what is valid."""

import pytest

from tessel.config import Config, load_config
from tessel.errors import ConfigError


def test_defaults_toml_and_overrides(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[model]\nname = "lstm_lm"\ndim = 32\n[train]\nlr = 1\nsteps = 7\n')
    cfg = load_config(f, ["train.steps=9", "model.tie_embeddings=true", "data.zipf_s=1.3"])
    assert (cfg.model.name, cfg.model.dim, cfg.train.steps, cfg.train.lr) == ("lstm_lm", 32, 9, 1.0)
    assert cfg.model.tie_embeddings is True and cfg.data.zipf_s == 1.3
    assert isinstance(cfg.train.lr, float)
    # the printed config loads back to the same values
    g = tmp_path / "again.toml"
    g.write_text(cfg.to_toml())
    assert load_config(g).to_dict() == cfg.to_dict()


def test_resolved_data_source():
    assert load_config().data_source == "zipf"
    assert load_config(None, ["data.path=x/*.txt"]).data_source == "text"
    assert load_config(None, ["model.name=classifier"]).data_source == "gaussian"


@pytest.mark.parametrize("override,needles", [
    ("model.name=vgg", ["model.name", "transformer_lm, lstm_lm, classifier"]),
    ("train.optimizer=lamb", ["train.optimizer", "adamw, adam, sgd, adagrad"]),
    ("train.steps=0", ["train.steps", ">= 1"]),
    ("train.steps=2.5", ["train.steps", "int"]),
    ("train.lr=fast", ["train.lr", "float"]),
    ("checkpoint.resume=maybe", ["checkpoint.resume", "bool"]),
    ("model.dropout=1.5", ["model.dropout", "[0, 1)"]),
    ("train.stepz=3", ["train.stepz", "train.steps"]),
    ("trian.steps=3", ["trian", "valid sections"]),
    ("steps=3", ["section.key"]),
    ("data.source=gaussian", ["gaussian", "classifier"]),
    ("data.source=text", ["data.path"]),
])
def test_invalid_values_name_key_and_choices(override, needles):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg


def test_toml_errors(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[train\nsteps=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)
    f.write_text("steps = 3\n")
    with pytest.raises(ConfigError, match="must be a \\[section\\]"):
        load_config(f)
    f.write_text('[train]\nsteps = "many"\n')
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(f)


def test_config_is_plain_dataclasses():
    cfg = Config()
    assert set(cfg.to_dict()) == {"model", "data", "parallel", "train", "checkpoint", "sparse", "pipeline",
                                  "tensor", "metrics", "plan"}
