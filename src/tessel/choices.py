"""Every closed set of names tessel accepts, in one place: the config validates against these and the
packages dispatch on them, so a new schedule or strategy is added once.

    >>> "async-predict" in SCHEDULES and "3d" in TP_MODES
    True
"""

MODELS = ("transformer_lm", "lstm_lm", "classifier")

# sparse tables (tessel.sparse): the strategies a table can be served by; auto asks the cost model
SPARSE_STRATEGIES = ("auto", "dense", "allgather", "ps", "alltoall", "torch-sparse")
SPARSE_SPLITS = ("auto", "column", "row")
ROW_OPTIMIZERS = ("auto", "sgd", "adagrad", "adam", "adamw")

# pipeline schedules (tessel.pipeline): flushed, asynchronous (no flush), and torch's own (the peer)
SYNC_SCHEDULES = ("gpipe", "1f1b")
ASYNC_SCHEDULES = ("async", "async-stash", "async-predict")
# torch's interleaved and zero-bubble schedules run two stages per rank: loop (r, r + pp) or V (r, 2pp - 1 - r)
TORCH_MULTI_SCHEDULES = ("torch-interleaved-1f1b", "torch-interleaved-zb", "torch-zbv")
TORCH_SCHEDULES = ("torch-gpipe", "torch-1f1b") + TORCH_MULTI_SCHEDULES
SCHEDULES = SYNC_SCHEDULES + ASYNC_SCHEDULES + TORCH_SCHEDULES
PREDICT_VARIANTS = ("v1", "v2")

# tensor parallelism (tessel.tensor): tessel's layers on a 1-, 2- or 3-D grid, or torch's 1-D (the peer)
TP_MODES = ("1d", "2d", "3d", "torch-1d")
