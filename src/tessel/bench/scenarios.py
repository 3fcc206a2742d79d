"""What a benchmark runs: models × strategies × host counts × link rates.

A *strategy* is a set of extra ``tessel train`` flags; every strategy of a scenario runs the same
model, data and global batch, so their step times compare like for like. The scenario names the
baseline the ratios are taken against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass
class Scenario:
    name: str
    about: str
    models: dict[str, list[str]]  # model label -> tessel train flags
    strategies: dict[str, list[str]]  # strategy label -> extra flags
    baseline: str
    hosts: list[int] = field(default_factory=lambda: [1, 2, 4])
    rates: list[str] = field(default_factory=lambda: ["1gbit", "200mbit"])
    steps: int = 12
    common: list[str] = field(default_factory=lambda: ["--batch", "32", "--metrics.progress", "log",
                                                       "--metrics.plot", "false", "--checkpoint.enabled", "false"])


# Each model's weights are what data parallelism moves every step: ~10 MB for the LMs, ~43 MB for the
# classifier's big fully connected layers (the VGG-like case).
DDP = Scenario(
    name="ddp",
    about="data parallelism with DDP: tessel's wrapper (traffic counted through tessel.comm) against torch DDP "
          "as shipped, on the three reference models",
    models={
        "transformer_lm": ["--model", "transformer_lm"],
        "lstm_lm": ["--model", "lstm_lm", "--model.softmax", "sampled"],
        "classifier": ["--model", "classifier", "--batch", "64"],
    },
    strategies={"tessel-ddp": ["--parallel.ddp_comm", "tessel"], "torch-ddp": ["--parallel.ddp_comm", "torch"]},
    baseline="torch-ddp",
)

SCENARIOS = {s.name: s for s in (DDP,)}


def get(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ConfigError(f"unknown benchmark scenario '{name}'; valid: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]
