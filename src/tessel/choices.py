"""Every closed set of choices tessel accepts, as typed records in one registry.

A config value is validated once, here, and resolved into its record: a :class:`Schedule`, a
:class:`TensorMode`, a :class:`TableStrategy`, an :class:`Optimizer`, a :class:`Prediction`. Code downstream
asks the record what it can do (``plan.schedule.flushed``, ``mode.serves_tables``, ``strategy.served``) and
never compares a name, so a new schedule or strategy that behaves like an existing one is one entry:

    >>> schedule("async-predict").asynchronous, tensor_mode("3d").axes, table_strategy("ps").served
    (True, ('tp_x', 'tp_y', 'tp_z'), True)
    >>> import dataclasses
    >>> register(dataclasses.replace(schedule("1f1b"), name="my-1f1b", planned=False)).flushed
    True
    >>> unregister(schedule("my-1f1b"))

Unknown names raise a one-line ConfigError naming the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule. tessel's own run ``order`` ("gpipe": all forwards then all backwards; "1f1b"); an
    asynchronous one streams 1F1B without a flush and meets its weights as ``weights`` says; torch's peers run
    ``torch_class`` of ``torch.distributed.pipelining`` on ``stages_per_rank`` stages (two: laid out ``layout``
    "loop", ranks r and r + pp, or "v", r and 2pp - 1 - r)."""

    name: str
    order: str = "1f1b"  # gpipe | 1f1b: the op order of a step (asynchronous schedules stream 1f1b)
    flushed: bool = True  # a step ends with every micro-batch's gradient applied (single-process math)
    weights: str = ""  # asynchronous: stale (live weights) | stash (PipeDream) | predict (SpecTrain)
    torch_class: str = ""  # torch's own schedule (the benchmark's peer): its class name
    stages_per_rank: int = 1
    layout: str = "loop"  # stages_per_rank 2: loop | v
    micro_rule: str = ""  # "" | at_least_pp (torch's 1F1B fills every stage) | multiple_of_pp (rounds of pp)
    planned: bool = True  # the planner enumerates it (torch's peers are benchmarks' only)
    staleness: int = 0  # ties between plans priced alike go to the one that changes the math least

    @property
    def asynchronous(self) -> bool:
        return not self.flushed

    @property
    def torch_peer(self) -> bool:
        return bool(self.torch_class)

    @property
    def serves_tables(self) -> bool:
        """torch's schedules run forwards and backwards inside torch, where no lookup can be tagged with its
        mini-batch nor the next batch's rows fetched: their tables stay dense."""
        return not self.torch_peer

    @property
    def holds_all_micro(self) -> bool:
        """Whether every micro-batch's activations are alive at once (GPipe), else at most pp - k (1F1B)."""
        return self.order == "gpipe"


@dataclass(frozen=True)
class Prediction:
    """How ``async-predict`` guesses the weights a forward should see (SpecTrain's variants)."""

    name: str
    again_in_backward: bool  # v1: predicted again at backward time (the backward reads newer weights); v2: reused
    staleness: int = 0  # added to the schedule's for the planner's ties
    kept_copies: int = 1  # weight copies a stage keeps (memory)
    live_backward: bool = False  # the backward multiplies by the live weights then (forward-only prediction)
    guess: str = "linear"  # linear: W - (sum of LRs) * direction; optimizer: the optimizer's own next updates


@dataclass(frozen=True)
class TensorMode:
    """A tensor-parallel layout: tessel's layers on a grid with ``axes``, or torch's own 1-D (the peer)."""

    name: str
    layers: str  # the layer family that builds it (tessel.tensor.layout): 1d | 2d | 3d
    axes: tuple[str, ...] = ("tp",)  # the grid's axes, outermost first (the mesh dims tp splits into)
    torch_peer: bool = False
    serves_tables: bool = False  # a table's rows stay whole on a rank (a 1-D vocabulary shard), so ps/alltoall
    whole_hidden: bool = False  # every rank holds whole hidden states (a sampled softmax head can run)
    composes: bool = True  # runs with dp and pp (torch's peer runs alone)
    sequence_parallel: bool = False  # may run torch's SequenceParallel
    planned: bool = True

    @property
    def needs_grid(self) -> bool:
        return len(self.axes) > 1


@dataclass(frozen=True)
class TableStrategy:
    """How a sparse table is held: left ``dense`` in the data-parallel sync (or with torch DDP's sparse
    gradients), or ``served`` row by row by tessel, built by the ``builds`` implementation."""

    name: str
    builds: str  # the implementation: dense | torch-sparse | allgather | ps | alltoall (tessel.sparse.serve)
    served: bool = True  # its rows move through tessel (taken out of the dense sync)
    sharded: bool = False  # rows or columns split over the ranks (a gather makes it whole)
    decides: bool = False  # auto: the cost model decides per table
    ddp_sparse: bool = False  # torch DDP's sparse gradients: only an unpipelined, untensor-parallel model has them
    needs_counts: bool = False  # its layout is balanced from every rank's access counts (ps, row-split alltoall)
    splits: bool = False  # split over the ranks by columns or by rows (alltoall; a row split needs the counts)


@dataclass(frozen=True)
class Optimizer:
    """A dense optimizer by its config name: the torch class, the row optimizer that mirrors it on served rows,
    its state tensors per parameter, and whether it has the smoothed direction weight prediction extrapolates."""

    name: str
    torch_class: str  # in torch.optim
    rows: str  # tessel.sparse.rowopt kind; '' : none mirrors it, so its tables stay dense
    states: int  # state tensors per parameter
    momentum_state: bool = False  # sgd: its state (and its direction) exist only with momentum > 0
    direction: bool = True  # keeps a smoothed update direction (what weight prediction extrapolates)
    lazy_rows: bool = False  # its row mirror is lazy (moments of untouched rows do not move)
    sparse: bool = False  # torch's class takes sparse gradients (DDP's sparse path, torch-sparse)
    options: tuple[tuple[str, object], ...] = ()  # constructor settings the name fixes (nadamw: decoupled decay)


@dataclass(frozen=True)
class Precision:
    """What a run computes in: the parameters' own dtype (``fp32``; fp64 for parity tests), or ``bf16-mixed``:
    forward and backward in ``compute`` under autocast, the parameters (masters), their gradients, the optimizer
    and the loss in fp32; activations and looked-up rows cross a channel in ``compute``, sums stay fp32."""

    name: str
    compute: str = ""  # torch dtype name of autocast's compute ("": none, the parameters' dtype throughout)


@dataclass(frozen=True)
class Recompute:
    """Which activations a chain layer keeps for backward: all (``none``), only its input, the rest recomputed in
    backward (``layers``), or also its matrix products' outputs, so only the cheap ops run twice (``selective``)."""

    name: str
    layers: bool = False  # each chain layer's forward runs again in backward
    keeps_matmuls: bool = False  # ... keeping what its matrix products computed
    # the share of a layer's forward + backward that runs again, as the planner prices it: a forward is about a
    # third of the work (2 of 6 FLOPs per weight and token); selective runs only the cheap ops again (assumed a
    # tenth, not measured)
    again: float = 0.0


_KINDS: dict[type, dict[str, object]] = {Schedule: {}, Prediction: {}, TensorMode: {}, TableStrategy: {},
                                         Optimizer: {}, Precision: {}, Recompute: {}}
_LABEL = {Schedule: "pipeline.schedule", Prediction: "pipeline.predict", TensorMode: "tensor.mode",
          TableStrategy: "sparse.strategy", Optimizer: "train.optimizer", Precision: "train.precision",
          Recompute: "train.recompute"}


def register(record):
    """Add (or replace) a record; returns it."""
    _KINDS[type(record)][record.name] = record
    return record


def unregister(record) -> None:
    _KINDS[type(record)].pop(record.name, None)


def _get(kind: type, name):
    if isinstance(name, kind):
        return name
    found = _KINDS[kind].get(name)
    if found is None:
        raise ConfigError(f"{_LABEL[kind]} '{name}' is invalid; valid: {', '.join(_KINDS[kind])}")
    return found


def names(kind: type) -> tuple[str, ...]:
    return tuple(_KINDS[kind])


def records(kind: type) -> list:
    return list(_KINDS[kind].values())


def schedule(name) -> Schedule:
    return _get(Schedule, name)


def prediction(name) -> Prediction:
    return _get(Prediction, name)


def tensor_mode(name) -> TensorMode:
    return _get(TensorMode, name)


def table_strategy(name) -> TableStrategy:
    return _get(TableStrategy, name)


def optimizer(name) -> Optimizer:
    return _get(Optimizer, name)


def precision(name) -> Precision:
    return _get(Precision, name)


def recompute(name) -> Recompute:
    return _get(Recompute, name)


for _r in (
        Schedule("gpipe", order="gpipe"),
        Schedule("1f1b"),
        Schedule("async", flushed=False, weights="stale", staleness=4),
        Schedule("async-stash", flushed=False, weights="stash", staleness=3),
        Schedule("async-predict", flushed=False, weights="predict", staleness=1),
        Schedule("torch-gpipe", order="gpipe", torch_class="ScheduleGPipe", planned=False),
        Schedule("torch-1f1b", torch_class="Schedule1F1B", micro_rule="at_least_pp", planned=False),
        Schedule("torch-interleaved-1f1b", torch_class="ScheduleInterleaved1F1B", stages_per_rank=2,
                 micro_rule="multiple_of_pp", planned=False),
        Schedule("torch-interleaved-zb", torch_class="ScheduleInterleavedZeroBubble", stages_per_rank=2,
                 micro_rule="multiple_of_pp", planned=False),
        Schedule("torch-zbv", torch_class="ScheduleZBVZeroBubble", stages_per_rank=2, layout="v",
                 micro_rule="multiple_of_pp", planned=False),
        Prediction("v1", again_in_backward=True, staleness=0, kept_copies=1),
        Prediction("v2", again_in_backward=False, staleness=1, kept_copies=2),
        Prediction("opt", again_in_backward=False, staleness=1, kept_copies=1, live_backward=True, guess="optimizer"),
        TensorMode("1d", "1d", serves_tables=True, whole_hidden=True),
        TensorMode("2d", "2d", axes=("tp_r", "tp_c")),
        TensorMode("3d", "3d", axes=("tp_x", "tp_y", "tp_z")),
        # torch's parallelize_module (the peer); shapes are checked as tessel's 1-D would cut them
        TensorMode("torch-1d", "1d", torch_peer=True, composes=False, sequence_parallel=True, planned=False),
        TableStrategy("auto", builds="", served=False, decides=True),
        TableStrategy("dense", builds="dense", served=False),
        TableStrategy("allgather", builds="allgather"),
        TableStrategy("ps", builds="ps", sharded=True, needs_counts=True),
        TableStrategy("alltoall", builds="alltoall", sharded=True, splits=True),
        TableStrategy("torch-sparse", builds="torch-sparse", served=False, ddp_sparse=True),
        Optimizer("adamw", "AdamW", rows="adamw", states=2, lazy_rows=True),
        Optimizer("adam", "Adam", rows="adam", states=2, lazy_rows=True),
        Optimizer("sgd", "SGD", rows="sgd", states=1, momentum_state=True, sparse=True),
        Optimizer("adagrad", "Adagrad", rows="adagrad", states=1, direction=False, sparse=True),
        # NAdam with AdamW's decoupled decay: the optimizer of the Nesterov method for asynchronous pipelines
        # (docs/pipeline.md); its Nesterov term has no row mirror and no direction prediction extrapolates
        Optimizer("nadamw", "NAdam", rows="", states=2, direction=False,
                  options=(("decoupled_weight_decay", True),)),
        Precision("fp32"),
        Precision("bf16-mixed", compute="bfloat16"),
        Recompute("none"),
        Recompute("layers", layers=True, again=1 / 3),
        Recompute("selective", layers=True, keeps_matmuls=True, again=0.1),
):
    register(_r)

# closed sets that are not records: plain name lists
MODELS = ("transformer_lm", "lstm_lm", "classifier")
SPARSE_SPLITS = ("auto", "column", "row")
GRAD_REDUCE = ("full", "bf16")  # data parallelism's gradient reduction: at their own width, or (asked for) bf16
