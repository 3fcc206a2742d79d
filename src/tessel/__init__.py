"""tessel: train one PyTorch model across many workers.

Public API::

    from tessel import Config, load_config, ParallelDims, build_mesh, parallelize, comm, sparse
"""

from . import comm, sparse
from .config import Config, load_config
from .errors import CheckpointError, CommError, ConfigError, DataError, PlanError, TesselError
from .mesh import ParallelDims, build_mesh, init_distributed
from .parallelize import apply_ddp, parallelize

__all__ = [
    "CheckpointError", "CommError", "Config", "ConfigError", "DataError", "ParallelDims", "PlanError",
    "TesselError", "apply_ddp", "build_mesh", "comm", "init_distributed", "load_config", "parallelize",
    "sparse",
]
__version__ = "0.1.0"
