"""What a benchmark runs: models × strategies × host counts × link rates.

A *strategy* is a set of extra ``tessel train`` flags; every strategy of a scenario runs the same
model, data and global batch, so their step times compare like for like. The scenario names the
baseline the ratios are taken against.
"""

from __future__ import annotations

import copy
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
    unshaped: bool = True  # also run each host count > 1 on unshaped links
    # strategy whose bytes tessel does not count -> a counted one that moves the same bytes (None: none does; its
    # bytes are then what the hosts' interfaces sent, where the runs recorded it, tessel/netif.py)
    same_bytes: dict[str, str | None] = field(default_factory=dict)
    common: list[str] = field(default_factory=lambda: ["--batch", "32", "--metrics.progress", "log",
                                                       "--metrics.plot", "false", "--checkpoint.enabled", "false"])
    # the emulated hosts' CPU settings beyond the budget: period_us, burst_us, pin (see EmulatedCluster)
    cluster: dict = field(default_factory=dict)


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
    same_bytes={"torch-ddp": "tessel-ddp"},
)

# Parallax's and EmbRace's setting: LMs whose tables (input embedding and sampled-softmax weights, 200K
# words) dwarf their dense weights, and a model with no tables at all.
SPARSE = Scenario(
    name="sparse",
    about="sparse tables: DDP dense (the whole table all-reduced), torch DDP with sparse gradients (gloo "
          "all-gathers each rank's coalesced rows), tessel allgather, ps (rows sharded over the hosts), alltoall "
          "(tables split over the hosts, EmbRace) with and without 2-D scheduling, and auto (the cost model's choice)",
    models={
        "lstm_lm": ["--model", "lstm_lm", "--model.softmax", "sampled", "--data.vocab_size", "200000"],
        "transformer_lm": ["--model", "transformer_lm", "--model.softmax", "sampled", "--data.vocab_size", "200000"],
        "classifier": ["--model", "classifier", "--batch", "64"],
    },
    strategies={"dense": ["--sparse", "dense"], "torch-sparse": ["--sparse", "torch-sparse"],
                "allgather": ["--sparse", "allgather"], "ps": ["--sparse", "ps"],
                "alltoall": ["--sparse", "alltoall"],
                "alltoall-unsched": ["--sparse", "alltoall", "--sparse.schedule", "false"],
                # every table fed from the batch fetched ahead: the sampled softmax's too, for the next targets
                "alltoall-all": ["--sparse", "alltoall", "--sparse.prefetch_all", "true"],
                "auto": ["--sparse", "auto"]},
    baseline="dense",
    same_bytes={"torch-sparse": None},
    hosts=[2, 4, 8],
    steps=8,
    # torch DDP broadcasts the 200 MB of tables at start-up in one collective: over 8 hosts at 200 Mbit/s
    # that takes longer than the default 30 s timeout.
    common=["--batch", "32", "--optimizer", "adagrad", "--lr", "0.05", "--timeout", "300", "--metrics.progress", "log",
            "--metrics.plot", "false", "--checkpoint.enabled", "false"],
)

# Where 2-D scheduling has something to hide: an LSTM LM whose 200K-word tables (moved by alltoall) carry most of
# the traffic, on 4 hosts, at about the link rate where the traffic takes as long as the compute-only step (the
# report's "balanced link" column) and at half of it. The sparse scenario's LSTM is not such a cell: its dense
# LSTM weights (~5 MB, all-reduced) are most of its bytes, and its tables' traffic is under a fifth of the step.
OVERLAP = Scenario(
    name="overlap",
    about="2-D scheduling where sparse communication is a large share of the traffic (a third to two fifths of "
          "the bytes at batch 64, most of them at batch 256): an LSTM LM with a 200K vocabulary and a small cell "
          "(1 layer, 160 units, so DDP's all-reduce is small), on 4 hosts unless --hosts says otherwise, its tables "
          "split by "
          "alltoall with 2-D scheduling (traffic overlapped with backward and the next forward) and without, "
          "against torch's DDP with sparse gradients and ps",
    models={"lstm_lm": [*SPARSE.models["lstm_lm"], "--model.layers", "1", "--model.hidden", "160", "--batch", "64"],
            # 4x the tokens per step: 4x the rows the tables move, the same dense all-reduce, so that at 50 Mbit/s
            # the tables' traffic is over half of the unscheduled step
            "lstm_lm_b256": [*SPARSE.models["lstm_lm"], "--model.layers", "1", "--model.hidden", "160",
                             "--batch", "256"]},
    # torch's sparse DDP and ps beside them: the baselines EmbRace's 2.41x is over, in a cell whose bytes are
    # mostly the tables'
    strategies={"alltoall": SPARSE.strategies["alltoall"], "alltoall-unsched": SPARSE.strategies["alltoall-unsched"],
                "alltoall-all": SPARSE.strategies["alltoall-all"],
                "torch-sparse": SPARSE.strategies["torch-sparse"], "ps": SPARSE.strategies["ps"]},
    baseline="alltoall-unsched",
    same_bytes={"torch-sparse": None},
    hosts=[4],
    rates=["100mbit", "50mbit"],
    steps=12,
    common=SPARSE.common,
)

# SpecTrain's setting: a model cut into 4 stages, one per host, against data parallelism over the same 4
# hosts and against torch.distributed.pipelining's schedules on the very same stages and micro-batches.
# Layer counts are chosen so that the stages can balance (8 equal classifier layers + a small head).
_PP = ["--pp", "4", "--pipeline.schedule"]
PIPELINE = Scenario(
    name="pipeline",
    about="pipeline parallelism on 4 hosts: DDP (4 replicas) against torch's ScheduleGPipe and Schedule1F1B and "
          "tessel's gpipe, 1f1b, async-stash (PipeDream) and async-predict (SpecTrain) on the same 4 stages, and "
          "torch's ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble on 8 stages, "
          "two per host",
    models={
        "classifier": ["--model", "classifier", "--model.layers", "8", "--model.hidden", "1024",
                       "--model.in_features", "1024", "--batch", "128", "--micro-batches", "4"],
        "transformer_lm": ["--model", "transformer_lm", "--model.layers", "12", "--model.dim", "128",
                           "--data.vocab_size", "4096", "--seq-len", "32", "--batch", "32", "--micro-batches", "4"],
    },
    # plain DDP (every table dense), the data-parallel peer; micro-batches would only slow it down
    strategies={"ddp": ["--pp", "1", "--micro-batches", "1", "--sparse", "dense"],
                "torch-gpipe": [*_PP, "torch-gpipe"], "torch-1f1b": [*_PP, "torch-1f1b"],
                "torch-interleaved-1f1b": [*_PP, "torch-interleaved-1f1b"],
                "torch-interleaved-zb": [*_PP, "torch-interleaved-zb"], "torch-zbv": [*_PP, "torch-zbv"],
                "gpipe": [*_PP, "gpipe"], "1f1b": [*_PP, "1f1b"],
                "async-stash": [*_PP, "async-stash"], "async-predict": [*_PP, "async-predict"]},
    baseline="torch-1f1b",
    same_bytes={"torch-gpipe": "gpipe", "torch-1f1b": "1f1b", "torch-interleaved-1f1b": None,
                "torch-interleaved-zb": None, "torch-zbv": None},
    hosts=[4],
    unshaped=False,
    steps=16,
    common=["--optimizer", "sgd", "--lr", "0.01", "--timeout", "120", "--metrics.progress", "log",
            "--metrics.plot", "false", "--checkpoint.enabled", "false"],
)

# SpecTrain's own regime: one micro-batch per step, where a flush costs most (each stage idles while the
# other N - 1 work) and the asynchronous stages run up to N - 1 updates ahead. Of torch's schedules only
# ScheduleGPipe runs fewer micro-batches than stages: it and tessel's 1f1b are the flushed peers.
PIPELINE_M1 = Scenario(
    name="pipeline-m1",
    about="pipeline parallelism at one micro-batch per step on 4 hosts: DDP against the flushed schedules (tessel's "
          "1f1b and torch's ScheduleGPipe, the one torch schedule that runs fewer micro-batches than stages), "
          "async-stash (PipeDream) and async-predict (SpecTrain), same stages and batch as the pipeline scenario; "
          "classifier-even: 8 identical 1024 x 1024 layers cut 2,2,2,2",
    # classifier-even: 8 identical 1024 x 1024 layers (7 hidden and a head of 1024 classes), cut 2,2,2,2: stages
    # of equal layers (the last adds a 1024-class loss, the first skips its input's gradient), where an
    # asynchronous stage should idle for little but what the runtime costs
    models={**{m: [*flags, "--micro-batches", "1"] for m, flags in PIPELINE.models.items()},
            "classifier-even": ["--model", "classifier", "--model.layers", "7", "--model.hidden", "1024",
                                "--model.in_features", "1024", "--model.classes", "1024", "--batch", "128",
                                "--micro-batches", "1", "--pipeline.split", "2,2,2,2"]},
    strategies={k: PIPELINE.strategies[k] for k in ("ddp", "torch-gpipe", "1f1b", "async-stash", "async-predict")},
    baseline="1f1b", hosts=[4], unshaped=False, steps=16, common=list(PIPELINE.common),
    # torch's p2p sends are not counted; at one micro-batch its GPipe moves what tessel's 1f1b does
    same_bytes={"torch-gpipe": "1f1b"},
)

# The 3-D paper's setting in miniature: a stack of Transformer blocks split over every host, with the token
# table and head small beside the blocks (vocabulary 512), so the blocks' traffic is what is compared.
_TP = ["--tp", "0", "--tensor.mode"]
TENSOR = Scenario(
    name="tensor",
    about="tensor parallelism over all hosts: torch's native 1-D (parallelize_module, Colwise/Rowwise, "
          "loss_parallel; also with sequence parallelism) against "
          "tessel's 1-D (Megatron), 2-D (SUMMA) and 3-D (4 hosts 2x2x1, 8 hosts 2x2x2), 3-D also with re-gather",
    models={"blocks": ["--model", "transformer_lm", "--model.layers", "4", "--model.dim", "256", "--model.heads", "8",
                       "--data.vocab_size", "512", "--seq-len", "64", "--batch", "16"]},
    strategies={"torch-1d": [*_TP, "torch-1d"],
                "torch-1d-sp": [*_TP, "torch-1d", "--tensor.sequence_parallel", "true"],
                "1d": [*_TP, "1d"], "2d": [*_TP, "2d"], "3d": [*_TP, "3d"],
                "3d-regather": [*_TP, "3d", "--tensor.regather", "true"]},
    baseline="torch-1d",
    same_bytes={"torch-1d": None, "torch-1d-sp": None},
    hosts=[4, 8],
    unshaped=False,
    steps=10,
    common=["--optimizer", "adamw", "--timeout", "120", "--metrics.progress", "log", "--metrics.plot", "false",
            "--checkpoint.enabled", "false"],
)

# The composition issue's setting: one Transformer LM over 8 hosts, plain DDP against the best single axis (an
# 8-stage SpecTrain pipeline, 3-D tensor parallelism on the 2x2x2 cube) and composed plans. Blocks dominate
# the weights (vocabulary 512), and there are enough of them for 8 stages. The two dp x pp async-predict plans
# are the composed plans `tessel plan --allow-async` ranks best for this model on 8 hosts (dp2 x pp4 at
# 200 Mbit/s, dp4 x pp2 at 1 Gbit/s).
COMPOSE = Scenario(
    name="compose",
    about="composed parallelism on 8 hosts: DDP (8 replicas) against the best single axis (pp=8 async-predict, "
          "tp=8 3-D 2x2x2) and composed plans (dp2 x pp2 x tp2 1-D, pp2 x tp4 3-D 2x2x1 with 1f1b and async-predict, "
          "dp2 x pp4 and dp4 x pp2 async-predict)",
    models={"transformer_lm": ["--model", "transformer_lm", "--model.layers", "6", "--model.dim", "256",
                               "--model.heads", "8", "--data.vocab_size", "512", "--seq-len", "64", "--batch", "32",
                               "--micro-batches", "2"]},
    strategies={"ddp": ["--micro-batches", "1"],
                "pp8-async-predict": ["--pp", "8", "--pipeline.schedule", "async-predict"],
                "tp8-3d": ["--tp", "8", "--tp-mode", "3d", "--micro-batches", "1"],
                "dp2-pp2-tp2-1d": ["--dp", "2", "--pp", "2", "--tp", "2", "--tp-mode", "1d"],
                "pp2-tp4-3d": ["--pp", "2", "--tp", "4", "--tp-mode", "3d"],
                "pp2-tp4-3d-async-predict": ["--pp", "2", "--tp", "4", "--tp-mode", "3d", "--pipeline.schedule",
                                             "async-predict"],
                "dp2-pp4-async-predict": ["--dp", "2", "--pp", "4", "--pipeline.schedule", "async-predict"],
                "dp4-pp2-async-predict": ["--dp", "4", "--pp", "2", "--pipeline.schedule", "async-predict"]},
    baseline="ddp",
    hosts=[8],
    unshaped=False,
    steps=8,
    common=["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01", "--timeout", "120", "--metrics.progress", "log",
            "--metrics.plot", "false", "--checkpoint.enabled", "false"],
)

# Sparse tables inside composed layouts (a 200K vocabulary, dp filling what pp or tp leave: dp2 on 4 hosts, dp4 on
# 8, one global batch): the pipeline's first stage serves the input table and its last the sampled softmax's; under
# 1-D tensor parallelism each rank serves its vocabulary shard of the token table and, with a sampled softmax, the
# whole head's tables.
_TABLES = {"dense": ["--sparse", "dense"], "ps": ["--sparse", "ps"], "alltoall": ["--sparse", "alltoall"],
           "auto": ["--sparse", "auto"]}
_TABLES_COMMON = ["--batch", "32", "--optimizer", "adagrad", "--lr", "0.05", "--timeout", "300",
                  "--metrics.progress", "log", "--metrics.plot", "false", "--checkpoint.enabled", "false"]
TABLES_PP = Scenario(
    name="tables-pp",
    about="sparse tables under pipeline parallelism: pp2 x dp (dp2 on 4 hosts, dp4 on 8), LSTM LM with a 200K "
          "vocabulary and sampled softmax, tables dense (all-reduced over each stage's dp group) vs ps vs alltoall "
          "vs auto",
    models={"lstm_lm": ["--model", "lstm_lm", "--model.softmax", "sampled", "--data.vocab_size", "200000",
                        "--pp", "2", "--micro-batches", "2"]},
    strategies=dict(_TABLES), baseline="dense", hosts=[4, 8], unshaped=False, steps=6, common=list(_TABLES_COMMON))
TABLES_TP = Scenario(
    name="tables-tp",
    about="sparse tables under tensor parallelism: tp2 x dp (1-D; dp2 on 4 hosts, dp4 on 8), Transformer LM with "
          "a 200K vocabulary and a sampled softmax (its head's tables served whole by every tp rank) or the full "
          "softmax (its vocabulary-parallel head stays a dense weight), tables dense vs ps vs alltoall vs auto",
    models={"transformer_lm_sampled": ["--model", "transformer_lm", "--model.softmax", "sampled", "--data.vocab_size",
                                       "200000", "--tp", "2", "--tp-mode", "1d"],
            "transformer_lm": ["--model", "transformer_lm", "--data.vocab_size", "200000", "--tp", "2", "--tp-mode",
                               "1d"]},
    strategies=dict(_TABLES), baseline="dense", hosts=[4, 8], unshaped=False, steps=6, common=list(_TABLES_COMMON))

# Mixed precision: every layout run in fp32 and in bf16-mixed on the same hosts, data and steps, so each bf16
# cell's ratio is taken against its own layout in fp32. precision-one: the default model on one process (the
# compute alone); precision: the sparse LSTM (ps, alltoall) and a 4-stage pipeline (1f1b, async-predict) on 4
# hosts; precision-8: 3-D 2x2x2 and torch's 1-D over 8 hosts, and dp2 x pp2 x tp2.
_PRECISION = {"fp32": ["--train.precision", "fp32"], "bf16-mixed": ["--train.precision", "bf16-mixed"]}
# bf16-mixed with the data-parallel gradients reduced in bf16 too, as a user asks for it: the one fp32 channel left
# (dp.dense) then halves as well. Where a layout has no data axis (the 4-stage pipelines) it is bf16-mixed again.
_PRECISION_DP = {**_PRECISION, "bf16-grads": ["--train.precision", "bf16-mixed", "--parallel.grad_reduce", "bf16"]}
_LSTM_200K = ["--model", "lstm_lm", "--model.softmax", "sampled", "--data.vocab_size", "200000", "--batch", "32",
              "--optimizer", "adagrad", "--lr", "0.05"]
PRECISION_ONE = Scenario(
    name="precision-one",
    about="bf16-mixed against fp32 on one process: the default Transformer LM (compute only, no traffic)",
    models={"transformer_lm": ["--model", "transformer_lm"]},
    strategies=dict(_PRECISION), baseline="fp32", hosts=[1], unshaped=False, steps=30)
PRECISION = Scenario(
    name="precision",
    about="bf16-mixed against fp32 on 4 hosts: the LSTM LM's 200K-word tables by ps and by alltoall, and a 4-stage "
          "pipeline (1f1b, async-predict, 4 micro-batches)",
    models={"lstm_lm-ps": [*_LSTM_200K, "--sparse", "ps"], "lstm_lm-alltoall": [*_LSTM_200K, "--sparse", "alltoall"],
            **{f"transformer_lm-pp4-{s}": [*PIPELINE.models["transformer_lm"], "--pp", "4", "--optimizer", "sgd",
                                           "--lr", "0.01", "--pipeline.schedule", s]
               for s in ("1f1b", "async-predict")}},
    strategies=dict(_PRECISION_DP), baseline="fp32", hosts=[4], rates=["200mbit"], unshaped=False, steps=10,
    common=list(_TABLES_COMMON))
PRECISION_8 = Scenario(
    name="precision-8",
    about="bf16-mixed against fp32 on 8 hosts: tessel's 3-D 2x2x2 and torch's native 1-D over every host, and "
          "dp2 x pp2 x tp2 (1-D)",
    models={"blocks-tp8-3d": [*TENSOR.models["blocks"], "--tp", "8", "--tp-mode", "3d"],
            "blocks-tp8-torch-1d": [*TENSOR.models["blocks"], "--tp", "8", "--tp-mode", "torch-1d"],
            "transformer_lm-dp2-pp2-tp2": [*COMPOSE.models["transformer_lm"], "--dp", "2", "--pp", "2", "--tp", "2",
                                           "--tp-mode", "1d"]},
    strategies=dict(_PRECISION_DP), baseline="fp32", hosts=[8], rates=["200mbit"], unshaped=False, steps=8,
    common=["--optimizer", "adamw", "--timeout", "300", "--metrics.progress", "log", "--metrics.plot", "false",
            "--checkpoint.enabled", "false"])

SCENARIOS = {s.name: s for s in (DDP, SPARSE, OVERLAP, PIPELINE, PIPELINE_M1, TENSOR, COMPOSE, TABLES_PP, TABLES_TP,
                                           PRECISION_ONE, PRECISION, PRECISION_8)}


def get(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ConfigError(f"unknown benchmark scenario '{name}'; valid: {', '.join(SCENARIOS)}, plan")
    return copy.deepcopy(SCENARIOS[name])  # callers narrow it to the flags they were given
