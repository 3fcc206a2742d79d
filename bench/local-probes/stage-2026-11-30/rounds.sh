#!/bin/bash
# stage 0's CPU per step in pp2 GPipe m8 against the same layers alone (GPipe order, SGD), alternating order
cd /work/main/bench/local-probes
for r in 1 2 3 4 5 6; do
  for w in $( [ $((r % 2)) = 1 ] && echo "pipe alone" || echo "alone pipe" ); do
    if [ $w = pipe ]; then
      STEPS=20 bash lrun.sh r$r --pp 2 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1 --metrics.heldout false > /dev/null
      python -c "import json; s=json.load(open('/tmp/grp/r$r/summary.json')); p=s['pipeline']; print('round $r pipe stage0_cpu_ms', round(p['cpu_per_step_per_rank'][0]*1e3,1), 'step_ms', round(s['median_step_time']*1e3,1))"
    else
      echo "round $r $(OMP_NUM_THREADS=1 python /tmp/s33/prof/alone2.py 2>/dev/null)"
    fi
  done
done
