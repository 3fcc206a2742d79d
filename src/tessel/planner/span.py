"""How long a step's micro-batches take over the pipeline stages, from each stage's slot: the planner's schedule
arithmetic (:mod:`.estimate` gives it the stages' compute, work and sends).

A flushed step is the first micro-batch's trip through every stage, each at its own slot, then one slowest slot
per further micro-batch (the first trip's slots are each stage's work alone: its sends are the trip's crossings); an
asynchronous one is m slowest slots (no flush). GPipe runs every forward before any
backward, so each of its two phases is paced by its own slowest stage:

    >>> from tessel.plan import ParallelPlan
    >>> plan = ParallelPlan(dp=1, pp=2, micro_batches=4, schedule="gpipe")
    >>> send = [(0.0, 0.0, 0.0)] * 2  # boundary sends that take no time
    >>> # stage 0: forward 1, backward 1; stage 1: forward 0.5, backward 4.5 (seconds a micro-batch)
    >>> comm, bubble = pipeline(plan, compute=[2.0, 5.0], forward=[1.0, 0.5], work=[2.0, 5.0], send=send, hops=[0, 0])
    >>> 4 * 5.0 + bubble  # (1 + 0.5) + 3 x 1 + (1 + 4.5) + 3 x 4.5; 1F1B: 2 + 5 + 3 x 5 = 22
    23.5
"""

from __future__ import annotations

from ..plan import ParallelPlan


def phases(compute: list[float], forward: list[float], work: list[float], send: list[tuple[float, float, float]]
           ) -> list[tuple[float, float]]:
    """Per stage, a micro-batch's (forward, backward) slot: its forward's compute or its activation's send, then its
    backward's or its input gradient's send (``forward``: the forward's part of ``compute``). The work beyond the
    compute (the tp collectives, FSDP's gathers: one each way) and the boundary latency go half to each."""
    out = []
    for c, f, w, (s_out, s_in, lat) in zip(compute, forward, work, send):
        extra = (w - c) / 2
        out.append((max(f + extra, s_out) + lat / 2, max(c - f + extra, s_in) + lat / 2))
    return out


def pipeline(plan: ParallelPlan, compute: list[float], forward: list[float], work: list[float],
             send: list[tuple[float, float, float]], hops: list[float], after_idle=None) -> tuple[float, float]:
    """(exposed communication, bubble) seconds of a step's micro-batches over the stages: per stage its compute and
    the forward's part of it, its work with the collectives it waits on (tp, FSDP's gathers), its boundary sends
    (activation, gradient, latency) and one activation's and gradient's trip over its boundary. ``after_idle``:
    seconds -> seconds a burst of compute takes on a host that has idled (Topology.after_idle): a flushed step's
    fill and drain (each stage's first micro-batch, forward and backward, after waiting for its neighbour) run so."""
    m = plan.micro_batches
    # a micro-batch's slot on a stage is its work, or its boundary sends where those take longer: sends are posted
    # asynchronously and travel while the stage computes
    slots = [max(w, s_out + s_in) + lat for w, (s_out, s_in, lat) in zip(work, send)]
    flushed = plan.pp > 1 and plan.schedule.flushed
    # the first micro-batch's trip runs each stage's work in turn, and its sends are the crossings ``hops`` adds below:
    # its slots are the work alone (a slot bounded by its sends would count each crossing twice; docs/benchmarks.md,
    # "FSDP's calls timed in FSDP's order", the last parts: priced so once the link's burst was fitted over two sizes).
    # GPipe's phases, where not paced by the same stage (a last stage whose fused loss runs in its forward, against
    # stages of blocks), make its step longer than 1F1B's, whose slots hold a forward and a backward each
    if flushed and plan.schedule.holds_all_micro:
        alone = [(0.0, 0.0, lat) for _, _, lat in send]  # (no sends: the first trip's are its crossings)
        both, first = phases(compute, forward, work, send), phases(compute, forward, work, alone)
        span = sum(sum(p[i] for p in first) + (m - 1) * max(p[i] for p in both) for i in (0, 1))
    elif flushed:
        span = sum(w + lat for w, (_, _, lat) in zip(work, send)) + (m - 1) * max(slots)
    else:
        span = m * max(slots)
    comm = (max(slots) - max(compute)) * m
    # a flushed step also waits for the first micro-batch to cross every boundary and its gradient to come back
    bubble = span - max(compute) * m - comm + (sum(hops) if flushed else 0.0)
    if flushed and after_idle:  # the fill's and drain's bursts, each after the stage idled
        bubble -= sum(c - after_idle(f) - after_idle(c - f) for c, f in zip(compute, forward))
    return comm, max(0.0, bubble)
