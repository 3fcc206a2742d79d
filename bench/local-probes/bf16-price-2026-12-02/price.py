"""The planner's price of one process (dp1) of the cells' Transformer under PRECISION, from a fresh profile at speed 1
(this machine, one thread): prints the predicted step in ms. Usage: python price.py PRECISION"""
import sys

from tessel.bench.plan_check import COMMON, MODELS
from tessel.config import load_config
from tessel.plan import ParallelPlan
from tessel.planner import Topology
from tessel.planner.estimate import estimate
from tessel.planner.profile import measure
from tessel.resolve import job_of, settings_of

cfg = load_config(None, [*MODELS["transformer_lm"], *COMMON, f"train.precision={sys.argv[1]}"])
profile = measure(job_of(cfg), dps=(1,))
e = estimate(ParallelPlan(dp=1), settings_of(cfg), profile, Topology(ranks=1, hosts=1, source="this machine"))
print(f"predicted {e.step * 1e3:.1f} ms (step factor {profile.step_factor:.3f})")
