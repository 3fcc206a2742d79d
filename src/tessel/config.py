"""Typed run configuration: dataclasses, loaded from TOML and overridden from the command line.

Every key has a type and, where the set is closed, a list of valid choices; an unknown key or a bad
value is a ConfigError that names the key and what would be valid (torchtitan once dropped unknown
TOML keys silently; we refuse them).

Example::

    from tessel.config import load_config
    cfg = load_config(None, ["train.steps=20", "model.name=lstm_lm"])
    assert cfg.train.steps == 20
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import choices, netif
from .choices import MODELS, SPARSE_SPLITS, Optimizer, Precision, Prediction, Schedule, TableStrategy, TensorMode
from .errors import ConfigError
from .settings import LR_SCHEDULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class ModelConfig:
    name: str = "transformer_lm"
    dim: int = 128  # embedding / model width (LSTM: projection size)
    hidden: int = 0  # transformer MLP width (0: 4*dim), LSTM cell size, classifier width
    layers: int = 2
    heads: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = False
    softmax: str = "full"  # LMs: full | sampled
    num_sampled: int = 256
    in_features: int = 1024  # classifier only
    classes: int = 100  # classifier only


@dataclass
class DataConfig:
    source: str = "auto"  # auto | zipf | text | gaussian (auto: gaussian for the classifier, text if path set)
    path: str = ""  # glob of UTF-8 text files, e.g. 'corpus/*.txt'
    vocab_size: int = 8192
    seq_len: int = 64
    zipf_s: float = 1.1
    separation: float = 6.0  # gaussian: norm of each class mean, against noise of 1 per feature
    cache_dir: str = ".tessel_cache"


@dataclass
class ParallelConfig:
    nproc: int = 0  # worker processes on this node (tessel's own launcher); 0: dp x pp x tp if above 1, else 2
    dp: int = 0  # 0: whatever the world leaves after pp and tp
    pp: int = 1
    tp: int = 1  # 0: every rank pp and dp leave (dp then defaults to 1)
    backend: str = "auto"  # auto (nccl with CUDA, else gloo) | gloo | nccl
    device: str = "auto"  # auto (cuda under nccl, else cpu) | cpu | cuda (under gloo: ranks may share a GPU)
    timeout: float = 30.0  # seconds any collective may wait before the job is ended
    ddp_comm: str = "tessel"  # tessel (gradients through tessel.comm, counted) | torch (DDP's own all-reduce)
    bucket_mb: float = 0.0  # DDP gradient bucket size; 0: tessel picks (see parallelize.auto_bucket_mb)
    grad_reduce: str = "full"  # dp gradients reduced at full (their own) width | bf16 (half the bytes, when asked)
    dp_shard: int = 1  # dp ranks each weight, gradient and optimizer state is sharded over (FSDP2): 1, or 0 = dp


@dataclass
class TrainConfig:
    steps: int = 300
    global_batch: int = 32
    micro_batches: int = 1
    optimizer: str = "adamw"  # adamw | adam | sgd | adagrad | nadamw
    lr: float = 3e-3
    momentum: float = 0.9  # sgd only
    beta1: float = 0.9  # adam, adamw, nadamw: the decay of the gradient's running mean
    beta2: float = 0.999  # ... and of its square's
    momentum_decay: float = 0.004  # nadamw: NAdam's psi, how fast its momentum weight ramps up to beta1 (torch's)
    weight_decay: float = 0.0
    schedule: str = "cosine"  # cosine | linear | constant
    warmup: int = 20
    min_lr_ratio: float = 0.1
    clip: float = 1.0  # max gradient norm; 0 disables clipping
    seed: int = 0
    dtype: str = "float32"  # float32 | float64 (the parameters')
    precision: str = "fp32"  # fp32 | bf16-mixed (compute in bfloat16, fp32 masters, optimizer and sums)
    recompute: str = "none"  # none | layers (each chain layer's forward again in backward) | selective (keeps matmuls)


@dataclass
class CheckpointConfig:
    dir: str = ""  # '' : <out>/checkpoints
    every: int = 0  # save every N steps (0: only at the end)
    keep: int = 2  # complete checkpoints kept on disk
    resume: bool = False  # continue from the latest complete checkpoint in dir
    enabled: bool = True
    init_from: str = ""  # start from this checkpoint's weights (any world size or tp layout); step, data restart


@dataclass
class SparseConfig:
    # auto (cost model per table) | dense | allgather | ps | alltoall | torch-sparse (see tessel.sparse)
    strategy: str = "auto"
    tables: str = ""  # per-table overrides, "name=strategy,name=strategy" (e.g. "embedding=ps,head.weight=dense")
    optimizer: str = "auto"  # rows of replaced tables: auto (follows train.optimizer) | sgd | adagrad | adam | adamw
    max_touched: float = 0.5  # a table whose step touches more of its rows than this stays dense (not auto)
    split: str = "auto"  # alltoall tables: column | row | auto (column unless the cost model prefers row)
    schedule: bool = True  # alltoall: overlap its traffic with backward and the next forward (2-D scheduling)
    # scheduled alltoall: fetch a step ahead every table whose ids begin with a batch tensor (a sampled softmax's for
    # the next targets), not the input table alone; faster where the link binds, slower where CPU does (docs/sparse.md)
    prefetch_all: bool = False
    link_mbit: float = 0.0  # link rate for auto; 0: TESSEL_LINK_MBIT if set, else measured at start-up
    partitions: int = 0  # ps row partitions; 0: chosen from measured access counts
    sample_batches: int = 2  # first batches used to measure sparsity and balance ps rows
    hosts: int = 0  # hosts the ranks fill, in order, for ps local aggregation; 0: torchrun's node ranks


@dataclass
class PipelineConfig:
    # pp > 1: gpipe | 1f1b (flush every step) | async | async-stash | async-predict (no flush) |
    # torch-gpipe | torch-1f1b | torch-interleaved-1f1b | torch-interleaved-zb | torch-zbv (torch's schedules,
    # the peers; the last three run two stages per rank)
    schedule: str = "1f1b"
    split: str = ""  # layer counts per stage, e.g. "3,3,2,2"; '' : balanced from a profile
    # async-predict: v1 (SpecTrain paper) | v2 (forward-only prediction reused in backward) | opt (the optimizer's
    # own next updates, forward only; XPipe/PipeOptim); tessel.pipeline.predict
    predict: str = "v1"
    # asynchronous schedules: PipeMare's LR rescheduling over this many steps (stage k's LR starts at lr / tau_k,
    # tau_k its staleness + 1, and rises to lr); 0: off; tessel.pipeline.schedules.delay_scale
    delay_lr: int = 0


@dataclass
class TensorConfig:
    # tp > 1: 1d (Megatron) | 2d (SUMMA) | 3d (all-gather / GEMM / reduce-scatter) | torch-1d (torch's own, the peer)
    mode: str = "1d"
    grid: str = ""  # 2d "rxc", 3d "xxyxz", e.g. "2x2x1"; '' : as square / cubic as tp allows
    regather: bool = False  # keep only shards for backward and gather again there (activation memory 1/tp)
    sequence_parallel: bool = False  # torch-1d: torch's SequenceParallel for the norms (torchtitan's plan)


@dataclass
class PlanConfig:
    source: str = ""  # '' : the flags' degrees and schedule | auto (tessel.planner chooses) | a plan .json file
    allow_async: bool = False  # auto may choose schedules that change the math (async, async-stash, async-predict)
    hosts: int = 0  # hosts the ranks fill, in order; 0: torchrun's node count (1 for local workers)
    link_mbit: float = 0.0  # link rate across hosts; 0: TESSEL_LINK_MBIT if set, else a loopback figure
    memory_gib: float = 0.0  # memory a rank may hold; 0: unbounded
    # share of that memory the planner leaves free for what its prediction misses: on the memory benchmark its picks
    # held up to 4.4% more tensors than predicted, and one predicted 1% under its budget ran out of memory
    # (docs/benchmarks.md, "Memory"); a plan given by hand is held to the whole budget
    memory_headroom: float = 0.05
    latency_us: float = 0.0  # seconds per ring step of a collective, in us; 0: 200 us, or probed under torchrun
    speed: float = 0.0  # a rank's compute relative to one core of this machine; 0: from the host CPU budget
    # --plan auto: time the model's steps and each kind of collective on every rank first, and price with what
    # they took (tessel.planner.calibrate). Off by default: on the emulated cluster it priced 4-host cells worse
    # than the probe or no better, and 8-host ones better on 2026-11-27 but far worse on 2026-12-07 (its compute
    # speed 2-3.6x below the probe's; docs/benchmarks.md, "A calibration trial" and "The calibration trial fitted as a
    # call is priced")
    trial: bool = False


@dataclass
class MetricsConfig:
    out: str = "runs/latest"  # metrics.jsonl, loss.png, summary.json and checkpoints go here
    log_every: int = 10
    progress: str = "auto"  # auto (bar on a terminal, log lines otherwise) | bar | log | off
    plot: bool = True
    tensorboard: bool = False
    heldout: bool = True  # after the run: held-out loss and accuracy of the initial and final weights (one process)
    # the plan's predicted peak tensor bytes per rank (rank 0 profiles the layers once) and the peak measured in
    # the second step (a dispatch mode over its operations; the first use in a process imports torch._dynamo, ~2 s)
    memory: bool = True
    # a network interface whose sent bytes (the kernel's count, headers included) each run records per rank, e.g.
    # an emulated host's eth0: how torch's own DDP traffic is measured (tessel/netif.py); "": none
    interface: str = ""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sparse: SparseConfig = field(default_factory=SparseConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    tensor: TensorConfig = field(default_factory=TensorConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The resolved config as TOML, loadable again with ``load_config``."""
        out = []
        for section, values in self.to_dict().items():
            out.append(f"[{section}]")
            out += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
            out.append("")
        return "\n".join(out)

    @property
    def data_source(self) -> str:
        """The data source after resolving ``auto``."""
        if self.data.source != "auto":
            return self.data.source
        if self.model.name == "classifier":
            return "gaussian"
        return "text" if self.data.path else "zipf"

    @property
    def nproc(self) -> int:
        """Local workers to start: ``parallel.nproc``, or the product of the degrees given (2 if that is 1)."""
        p = self.parallel
        if p.nproc:
            return p.nproc
        n = (p.dp or 1) * p.pp * (p.tp or 1)
        return n if n > 1 else 2

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir or Path(self.metrics.out) / "checkpoints")


# a key's valid values: a tuple, or a kind of record whose registered names are valid (tessel.choices)
CHOICES: dict[str, tuple[str, ...] | type] = {
    "model.name": MODELS,
    "model.softmax": ("full", "sampled"),
    "data.source": ("auto", "zipf", "text", "gaussian"),
    "parallel.backend": ("auto", "gloo", "nccl"),
    "parallel.device": ("auto", "cpu", "cuda"),
    "parallel.ddp_comm": ("tessel", "torch"),
    "parallel.grad_reduce": choices.GRAD_REDUCE,
    "train.optimizer": Optimizer,
    "train.schedule": LR_SCHEDULES,
    "train.dtype": ("float32", "float64"),
    "train.precision": Precision,
    "train.recompute": choices.Recompute,
    "metrics.progress": ("auto", "bar", "log", "off"),
    "sparse.strategy": TableStrategy,
    "sparse.split": SPARSE_SPLITS,
    "sparse.optimizer": Optimizer,  # or auto
    "pipeline.schedule": Schedule,
    "pipeline.predict": Prediction,
    "tensor.mode": TensorMode,
}


def valid(key: str) -> tuple[str, ...]:
    """The valid values of a closed config key."""
    found = CHOICES[key]
    if isinstance(found, type):
        if key == "sparse.optimizer":  # the optimizers that have a row mirror
            return ("auto",) + tuple(o.name for o in choices.records(found) if o.rows)
        return choices.names(found)
    return found

# Lower bounds of numeric keys; keys not listed must be >= 0 when numeric.
MINIMUM: dict[str, float] = {
    "model.dim": 1, "model.layers": 1, "model.heads": 1, "model.num_sampled": 1, "model.in_features": 1,
    "model.classes": 2, "data.vocab_size": 16, "data.seq_len": 2, "parallel.pp": 1,
    "parallel.timeout": 1, "train.steps": 1, "train.global_batch": 1,
    "train.micro_batches": 1, "train.lr": 0, "checkpoint.keep": 1, "metrics.log_every": 1,
    "sparse.sample_batches": 1, "data.separation": 1e-3,
}


# Upper bounds where a larger value would fail inside every worker: torch.manual_seed takes 64 bits, and a
# timeout near 1e14 s overflows timedelta (a week is already as good as none).
MAXIMUM: dict[str, int] = {"train.seed": 2**64 - 1, "parallel.timeout": 7 * 24 * 3600}


def _check_number(dotted: str, value: float) -> None:
    low, high = MINIMUM.get(dotted, 0), MAXIMUM.get(dotted)
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
        raise ConfigError(f"config key '{dotted}' is {value}; it must be a finite number >= {low:g}")
    if value < low or (high is not None and value > high):
        valid = f">= {low:g}" if high is None else f"from {low:g} to {high}"
        raise ConfigError(f"config key '{dotted}' is {value}; it must be {valid}")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def _section(cfg: Config, name: str) -> Any:
    names = [f.name for f in fields(cfg)]
    if name not in names:
        raise ConfigError(f"unknown config section '{name}'; valid sections: {', '.join(names)}")
    return getattr(cfg, name)


def _field_type(section: Any, key: str, dotted: str) -> type:
    types = {f.name: f.type for f in fields(section)}
    if key not in types:
        raise ConfigError(f"unknown config key '{dotted}'; valid keys: "
                          + ", ".join(f"{dotted.split('.')[0]}.{k}" for k in types))
    return {"int": int, "float": float, "bool": bool, "str": str}[types[key]]


def _coerce(dotted: str, typ: type, value: Any) -> Any:
    """Convert a TOML value or a CLI string to the key's type, or raise a ConfigError."""
    if isinstance(value, str) and typ is not str:
        text = value.strip().lower()
        try:
            if typ is bool:
                if text in ("1", "true", "yes", "on"):
                    return True
                if text in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return typ(float(text)) if typ is int and float(text).is_integer() else typ(text)
        except ValueError:
            raise ConfigError(f"config key '{dotted}' wants {typ.__name__}, got '{value}'") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ConfigError(f"config key '{dotted}' wants {typ.__name__}, got {value!r}")
    return value


def set_value(cfg: Config, dotted: str, value: Any) -> None:
    """Set ``section.key`` to ``value`` (a TOML value or a CLI string), checking key and type."""
    if dotted.count(".") != 1:
        raise ConfigError(f"config key '{dotted}' must look like section.key, e.g. train.steps")
    sec_name, key = dotted.split(".")
    section = _section(cfg, sec_name)
    setattr(section, key, _coerce(dotted, _field_type(section, key, dotted), value))


def validate(cfg: Config) -> Config:
    """Check every value against its choices and bounds; return cfg for chaining."""
    for sec in fields(cfg):
        section = getattr(cfg, sec.name)
        for f in fields(section):
            dotted, value = f"{sec.name}.{f.name}", getattr(section, f.name)
            if dotted in CHOICES and value not in valid(dotted):
                raise ConfigError(f"config key '{dotted}' is '{value}'; valid: {', '.join(valid(dotted))}")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                _check_number(dotted, value)
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(cfg.train, key) < 1.0:
            raise ConfigError(f"config key 'train.{key}' is {getattr(cfg.train, key)}; it must be in [0, 1)")
    if not 0.0 <= cfg.plan.memory_headroom < 1.0:
        raise ConfigError(f"config key 'plan.memory_headroom' is {cfg.plan.memory_headroom}; it must be a share in "
                          "[0, 1)")
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError(f"config key 'model.dropout' is {cfg.model.dropout}; it must be in [0, 1)")
    if cfg.data_source == "text" and not cfg.data.path:
        raise ConfigError("data.source is 'text' but data.path is empty; give a glob such as 'corpus/*.txt'")
    if cfg.model.name == "classifier" and cfg.data_source != "gaussian":
        raise ConfigError(f"model 'classifier' reads data.source 'gaussian', not '{cfg.data_source}'")
    if cfg.model.name != "classifier" and cfg.data_source == "gaussian":
        raise ConfigError(f"data.source 'gaussian' is for the classifier; model '{cfg.model.name}' "
                          "needs zipf or text")
    overrides = sparse_overrides(cfg)
    if cfg.metrics.interface and cfg.metrics.interface not in netif.interfaces():
        raise ConfigError(f"metrics.interface '{cfg.metrics.interface}' is not a network interface of this host; "
                          f"valid: {', '.join(netif.interfaces()) or 'none here'}, or empty for none")
    if cfg.parallel.backend == "nccl" and cfg.parallel.device == "cpu":
        raise ConfigError("parallel.backend 'nccl' moves GPU tensors only and parallel.device is 'cpu'; valid with "
                          "it: parallel.device auto or cuda, or parallel.backend gloo")
    if choices.precision(cfg.train.precision).compute and cfg.train.dtype != "float32":
        raise ConfigError(f"train.precision '{cfg.train.precision}' keeps float32 masters; train.dtype is "
                          f"'{cfg.train.dtype}': valid with it: train.dtype float32, or train.precision fp32")
    if cfg.plan.source == "auto" and cfg.parallel.dp_shard != 1:
        raise ConfigError(f"parallel.dp_shard={cfg.parallel.dp_shard} with plan.source auto: the planner decides "
                          "sharding itself (FSDP over the dp ranks beside DDP, where memory asks for it); valid: "
                          "plan.source auto with dp_shard 1, or dp_shard with the layout given by flags")
    ddp_sparse = [s for s in (cfg.sparse.strategy, *overrides.values()) if choices.table_strategy(s).ddp_sparse]
    if ddp_sparse and not choices.optimizer(cfg.train.optimizer).sparse:
        takes = ", ".join(o.name for o in choices.records(Optimizer) if o.sparse)
        raise ConfigError(f"sparse strategy '{ddp_sparse[0]}' needs a torch optimizer that takes sparse "
                          f"gradients; train.optimizer is '{cfg.train.optimizer}'; valid: {takes}")
    return cfg


def sparse_overrides(cfg: Config) -> dict[str, str]:
    """``sparse.tables`` ("name=strategy,...") as a dict, checked for form and strategy names."""
    out = {}
    for item in filter(None, (x.strip() for x in cfg.sparse.tables.split(","))):
        name, eq, strategy = item.partition("=")
        strategies = valid("sparse.strategy")
        if not eq or not name.strip() or strategy.strip() not in strategies:
            raise ConfigError(f"sparse.tables item '{item}' must be name=strategy with strategy one of "
                              f"{', '.join(strategies)}, e.g. 'embedding=ps,head.weight=dense'")
        out[name.strip()] = strategy.strip()
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the TOML file at ``path``, then ``section.key=value`` overrides; validated."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        try:
            doc = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file '{path}' is not valid TOML: {e}") from None
        for sec_name, table in doc.items():
            if not isinstance(table, dict):
                raise ConfigError(f"config file '{path}': '{sec_name}' must be a [section]")
            _section(cfg, sec_name)
            for key, value in table.items():
                set_value(cfg, f"{sec_name}.{key}", value)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        dotted, value = item.split("=", 1)
        set_value(cfg, dotted.strip(), value)
    return validate(cfg)


def all_keys() -> list[tuple[str, type, Any]]:
    """Every (section.key, type, default): the CLI builds its --section.key flags from this."""
    cfg = Config()
    out = []
    for sec in fields(cfg):
        section = getattr(cfg, sec.name)
        for f in fields(section):
            out.append((f"{sec.name}.{f.name}", _field_type(section, f.name, ""), getattr(section, f.name)))
    return out
