#!/bin/bash
# The probe (with the bytes a link passes at once after idling, tessel.planner.probe.link_burst) at the host counts
# and rates of the re-priced cells, as bench/plan-wait/probes.sh runs it; appended to bench/plan-burst/probes.jsonl.
#   bash bench/plan-burst/probes.sh 4:200mbit 4:1gbit 4:500mbit 4:300mbit 6:200mbit 6:1gbit 6:400mbit 8:1gbit 8:200mbit 8:500mbit
# and on 2026-12-07 (fourth session), for bench/plan-head:
#   bash bench/plan-burst/probes.sh 3:300mbit 5:150mbit 2:100mbit 6:500mbit
cd "$(dirname "$0")/../.." || exit 2
OUT=bench/plan-burst/probes.jsonl exec bash bench/plan-wait/probes.sh "$@"
