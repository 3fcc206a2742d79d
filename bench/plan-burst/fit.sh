#!/bin/bash
# The link's burst as the probe now fits it (fit.py), at every host count and rate of bench/plan-head/reprice.py's
# cells; appended to bench/plan-burst/fit.jsonl with the cell's hosts, rate and cpus.
#   bash bench/plan-burst/fit.sh 2:100mbit 3:300mbit 4:1gbit 4:200mbit 4:300mbit 4:500mbit 5:150mbit 6:1gbit \
#     6:200mbit 6:300mbit 6:400mbit 6:500mbit 8:1gbit 8:200mbit 8:300mbit 8:500mbit
cd "$(dirname "$0")/../.." || exit 2
SCRIPT=bench/plan-burst/fit.py TAG=burst OUT=bench/plan-burst/fit.jsonl exec bash bench/fsdp-rate/rates.sh "$@"
