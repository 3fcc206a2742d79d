"""tessel: train one PyTorch model across many workers.

Public API::

    from tessel import Config, load_config, ParallelPlan, TablePolicy, Settings, ParallelDims, build_mesh
    from tessel import parallelize, apply_ddp            # parallelize(model, plan, mesh, batches, settings)
    from tessel import Chain, Layer, register_model, comm, sparse
    from tessel import prepare, clip_grad_norm_          # your own loop: see tessel.prepare
    from tessel import unwrap, load_into                 # the trained model back, plain: see tessel.unwrap
    from tessel import init_distributed, shutdown        # join the world; leave it at the end of a worker
"""

from . import comm, sparse
from .chain import Chain, Layer, Runner
from .config import Config, load_config
from .errors import CheckpointError, CommError, ConfigError, DataError, PlanError, TesselError
from .mesh import ParallelDims, build_mesh, init_distributed, shutdown
from .parallelize import Parallelized, apply_ddp, parallelize
from .plan import ParallelPlan, TableChoice, TablePolicy
from .prepare import clip_grad_norm_, load, prepare, save
from .registry import register_model
from .settings import Settings
from .unwrap import full_state, load_into, unwrap

__all__ = [
    "Chain", "CheckpointError", "CommError", "Config", "ConfigError", "DataError", "Layer", "ParallelDims",
    "ParallelPlan", "Parallelized", "PlanError", "Runner", "TableChoice", "TesselError", "apply_ddp", "build_mesh",
    "clip_grad_norm_", "comm", "init_distributed", "load", "load_config", "parallelize", "prepare",
    "register_model", "save", "shutdown", "sparse", "full_state", "load_into", "unwrap", "Settings", "TablePolicy",
]
__version__ = "0.1.0"
