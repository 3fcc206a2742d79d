#!/bin/bash
# The probe (with the bytes a link passes at once after idling, tessel.planner.probe.link_burst) on the host counts
# and rates of the re-priced cells, each host at 2 cores / hosts as `tessel bench plan` gives it; one JSON line
# per cell, with its hosts and rate, appended to bench/plan-burst/probes.jsonl.
#   bash bench/plan-burst/probes.sh 4:200mbit 4:1gbit 4:500mbit 4:300mbit 6:200mbit 6:1gbit 6:400mbit 8:1gbit 8:200mbit 8:500mbit
cd "$(dirname "$0")/../.." || exit 2
for cell in "$@"; do
  h=${cell%%:*}; r=${cell#*:}
  cpus=$(python -c "print(round(2 / $h, 4))")
  line=$(tessel cluster run --hosts "$h" --rate "$r" --cpus "$cpus" --torchrun -- -m tessel.planner.probe 2>/dev/null \
         | grep '^{' | tail -1)
  [ -n "$line" ] || { echo "probe failed on $cell" >&2; continue; }
  python -c "import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({'hosts': $h, 'rate': '$r', 'cpus': $cpus, **d}))" "$line" \
    | tee -a bench/plan-burst/probes.jsonl
done
