"""One exception hierarchy for everything a user can get wrong.

The CLI prints a TesselError as one line on stderr and exits with code 2; any
other exception is a bug in tessel and keeps its traceback.
"""


class TesselError(Exception):
    """Base of every error caused by input: config, plan, data or checkpoint."""


class ConfigError(TesselError):
    """A config key is unknown or a value is invalid (the message names both and the valid choices)."""


class PlanError(TesselError):
    """Parallel degrees, batch sizes or launch settings do not fit together or with the world."""


class DataError(TesselError):
    """A data file is missing, empty or cannot be decoded, or a data state does not fit."""


class CheckpointError(TesselError):
    """A checkpoint is missing, corrupt, or was written for another model or layout."""


class CommError(RuntimeError):
    """A collective failed or timed out: a peer rank is dead, stuck or out of step.

    Not a TesselError: the input was fine, the job was not. The CLI still prints it as one line,
    naming the rank, the collective and the channel, and exits with code 1.
    """


class Preempted(RuntimeError):
    """A worker got SIGTERM: every rank stopped after the same step and saved a checkpoint.

    Not a TesselError either; the CLI prints it as one line and exits with 143 (128 + SIGTERM), so an elastic
    agent with restarts left starts the workers again and they continue from that checkpoint.
    """
