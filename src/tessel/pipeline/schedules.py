"""The order in which a stage runs forwards ("F", i) and backwards ("B", i) of micro-batches.

Synchronous schedules cover one step and end in a flush; the asynchronous one is a segment of an endless
1F1B stream: stage k keeps N − k − 1 mini-batches in flight from one step to the next (PipeDream's
warm-up depth), so there is no fill or drain bubble after the first step. Sends are asynchronous and
receives block, so any prefix of these lists is deadlock-free.

Example::

    >>> sync_ops(schedule("1f1b"), stage=0, stages=2, micro=3)
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    >>> async_ops(stage=0, stages=2, first=4, count=2)
    [('F', 4), ('B', 3), ('F', 5), ('B', 4)]
"""

from __future__ import annotations

from ..choices import Schedule, schedule


def chunks(name: Schedule | str) -> int:
    """Stages each rank runs under a schedule.

    >>> chunks("1f1b"), chunks("torch-interleaved-1f1b")
    (1, 2)
    """
    return schedule(name).stages_per_rank


def held(name: Schedule | str, rank: int, pp: int) -> list[int]:
    """The stages rank ``rank`` of ``pp`` runs: its own, or for torch's multi-stage schedules two of ``2 pp``,
    round-robin (interleaved: r and r + pp) or in a V (ZBV: r and 2 pp - 1 - r, so rank 0 holds both ends).

    >>> held("1f1b", 1, 4), held("torch-interleaved-zb", 1, 4), held("torch-zbv", 1, 4)
    ([1], [1, 5], [1, 6])
    """
    s = schedule(name)
    if s.stages_per_rank == 1:
        return [rank]
    return [rank, 2 * pp - 1 - rank] if s.layout == "v" else [rank + k * pp for k in range(s.stages_per_rank)]


def sync_ops(name: Schedule | str, stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """One flushed step of ``micro`` micro-batches: GPipe (all forwards, then all backwards) or 1F1B."""
    if schedule(name).holds_all_micro:
        return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]
    warm = min(stages - stage - 1, micro)
    ops = [("F", i) for i in range(warm)]
    for i in range(micro - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(micro - warm, micro)]


def async_ops(stage: int, stages: int, first: int, count: int) -> list[tuple[str, int]]:
    """Forwards of mini-batches ``first .. first+count-1`` interleaved with the backwards that the endless
    1F1B stream puts between them (those ``N − k − 1`` mini-batches older)."""
    lag = stages - stage - 1
    ops: list[tuple[str, int]] = []
    for i in range(first, first + count):
        ops.append(("F", i))
        if i - lag >= 0:
            ops.append(("B", i - lag))
    return ops


def ahead(i: int, micro: int, stage: int, stages: int) -> int:
    """Updates stage ``stage`` applies between micro-batch ``i``'s forward and that micro-batch's own update,
    in the endless 1F1B stream with one update per ``micro`` micro-batches (N − k − 1 when micro = 1).

    >>> [ahead(i, 1, 0, 4) for i in range(5)], [ahead(i, 4, 0, 4) for i in range(8)]
    ([0, 1, 2, 3, 3], [0, 0, 0, 0, 1, 1, 1, 0])
    """
    lag = stages - stage - 1
    return i // micro - max(0, (i - lag) // micro)


def delay_scale(j: int, stage: int, stages: int, micro: int, steps: int) -> float:
    """PipeMare's learning-rate rescheduling (arXiv 1910.05124, technique 1): what stage ``stage``'s update j
    multiplies its LR by, τ^-(1 - min(j / steps, 1)) with τ = 1 + the most updates its forward runs ahead of its
    own (N − k with one micro-batch per update): a stale stage starts at lr / τ and reaches the schedule's LR at
    step ``steps``; the last stage (τ = 1) and ``steps`` 0 keep the LR as it is.

    >>> [round(delay_scale(j, stage=0, stages=4, micro=1, steps=100), 6) for j in (0, 50, 100)]
    [0.25, 0.5, 1.0]
    """
    tau = 1 + -(-(stages - stage - 1) // micro)  # 1 + ceil(lag / micro): the worst of ``ahead``
    return 1.0 if not steps or tau == 1 else tau ** -max(0.0, 1.0 - j / steps)


def drain_ops(stage: int, stages: int, fed: int) -> list[tuple[str, int]]:
    """The backwards still owed after ``fed`` mini-batches went in: they empty the pipeline."""
    lag = stages - stage - 1
    return [("B", i) for i in range(max(0, fed - lag), fed)]
