#!/bin/bash
# FSDP's rates in FSDP's order (rates.py) at every host count and rate where a cell of bench/plan-head/reprice.py has
# an FSDP candidate, each host a machine's cores / hosts (as `tessel bench plan` ran them); appended to
# bench/fsdp-rate/rates.jsonl with the cell's hosts, rate and cpus. SCRIPT, TAG and OUT run another probe piece the
# same way (bench/plan-burst/fit.sh).
#   bash bench/fsdp-rate/rates.sh 2:100mbit 4:1gbit 4:200mbit 4:300mbit 4:500mbit 6:1gbit 6:200mbit 6:300mbit \
#     6:400mbit 6:500mbit 8:1gbit 8:200mbit
cd "$(dirname "$0")/../.." || exit 2
for cell in "$@"; do
  hosts=${cell%%:*}; rate=${cell#*:}
  cpus=$(python -c "import os; print(min(1.0, (os.cpu_count() or 1) / $hosts))")
  mbit=$(python -c "from tessel.cluster.emulate import parse_rate; print(parse_rate('$rate') / 1e6)")
  line=$(RATE_MBIT=$mbit tessel cluster run --hosts "$hosts" --rate "$rate" --cpus "$cpus" --torchrun -- \
         "${SCRIPT:-bench/fsdp-rate/rates.py}" 2>&1 | grep -o "${TAG:-fsdp} {.*" | head -1 | cut -d' ' -f2-)
  [ -n "$line" ] || { echo "$cell: no rates" >&2; continue; }
  python -c "import json, sys; d = json.loads(sys.argv[1]); print(json.dumps({'hosts': $hosts, 'rate': '$rate', \
'cpus': $cpus, **d}))" "$line" | tee -a "${OUT:-bench/fsdp-rate/rates.jsonl}"
done
