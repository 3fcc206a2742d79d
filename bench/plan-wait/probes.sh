#!/bin/bash
# The probe (with its wait after compute, tessel.planner.probe.wait_after) on the host counts and rates of the cells
# run since the probe held a job's mesh, each host at 2 cores / hosts as `tessel bench plan` gives it; one JSON line
# per cell, with its hosts and rate, appended to bench/plan-wait/probes.jsonl (or to $OUT).
#   bash bench/plan-wait/probes.sh 4:200mbit 6:1gbit 8:1gbit 8:200mbit
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-bench/plan-wait/probes.jsonl}
for cell in "$@"; do
  h=${cell%%:*}; r=${cell#*:}
  cpus=$(python -c "print(round(2 / $h, 4))")
  line=$(tessel cluster run --hosts "$h" --rate "$r" --cpus "$cpus" --torchrun -- -m tessel.planner.probe 2>/dev/null \
         | grep '^{' | tail -1)
  [ -n "$line" ] || { echo "probe failed on $cell" >&2; continue; }
  python -c "import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({'hosts': $h, 'rate': '$r', 'cpus': $cpus, **d}))" "$line" \
    | tee -a "$out"
done
