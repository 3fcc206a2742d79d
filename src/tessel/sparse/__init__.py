"""Sparsity-aware hybrid data parallelism (Parallax): dense weights by DDP, sparse tables row by row.

``shard`` finds the model's tables, measures how sparsely a step touches them, and replaces each
chosen table in place by a ``ps`` or ``allgather`` module (see :mod:`tessel.sparse.tables`). The model
code is untouched; wrap the rest in DDP afterwards (the tables are no longer parameters, so DDP leaves
them alone). In a training loop, between ``backward()`` and the dense optimizer's ``step()``::

    sparse = tessel.sparse.shard(model, [(x0, y0), (x1, y1)], strategy="ps", optimizer="adagrad", lr=0.1)
    model = DDP(model)
    ...
    loss.backward()
    sparse.reduce()          # push row gradients to their owners
    sparse.step(lr=0.1)      # owners update their rows
    dense_opt.step()

Strategies per table: ``dense`` (stays in DDP, whole gradient all-reduced), ``allgather``, ``ps``,
``alltoall`` (split over the ranks, EmbRace; :mod:`tessel.sparse.alltoall`), ``auto`` (the cost model of
:mod:`tessel.sparse.cost` picks per table), and ``torch-sparse`` (``sparse=True`` inside torch DDP as
shipped: the peer DDP-with-sparse-gradients). With scheduled ``alltoall`` tables, also call
``sparse.begin_step((inputs, targets), (next_inputs, next_targets))`` before each step's forward pass so the
tables' rows are fetched a step ahead (:mod:`tessel.sparse.schedule`): the input table's for the inputs, a sampled
softmax's for the targets.
"""

from __future__ import annotations

from .detect import find_tables
from .serve import BUILDERS, Survey, check_overrides, serve, shard, survey
from .served import SparseTables
from .tables import full_table

__all__ = ["shard", "survey", "serve", "Survey", "SparseTables", "find_tables", "full_table", "BUILDERS",
           "check_overrides"]
