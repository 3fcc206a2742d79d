"""The planner: enumerate every plan the world allows, estimate each, choose the fastest that fits.

TorchRec's planner shape over every axis: :mod:`.candidates` lists (dp, pp, tp) × tensor mode × schedule ×
micro-batches and drops what the model or the settings cannot run, with its reason; :mod:`.estimate` prices the
rest on a :class:`Topology` from one :mod:`.profile` of the plain model; :mod:`.choose` ranks them. It plans a
:class:`Job` (the model, a batch, the settings, the table policy every candidate keeps), never a config. This is
phase one and runs before any worker starts; phase two is ``--sparse auto`` in the workers, which decides each
table on live measurements and prints the completed plan.

    tessel plan --nproc 8 --hosts 8 --link-mbit 200            # ranked table for the default model
    tessel plan --model classifier --nproc 4 --json plan.json   # the winner, for tessel train --plan plan.json
    tessel train --nproc 4 --plan auto                          # plan, print, run the winner

In a program::

    from tessel.config import load_config
    from tessel.resolve import job_of
    from tessel.planner import choose, Topology
    result = choose(job_of(load_config(None, ["model.name=classifier"])), Topology(ranks=4, hosts=4, link_mbit=1000))
    print(result.table())
"""

from .choose import Planned, choose, short
from .job import Job
from .topology import PARALLAX_CLUSTER, TACC_CLUSTER, Topology

__all__ = ["Job", "Planned", "Topology", "choose", "short", "PARALLAX_CLUSTER", "TACC_CLUSTER"]
