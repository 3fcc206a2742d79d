#!/bin/bash
# the planner's price (a fresh profile each round) against pp2 GPipe m8 and dp2 m1 runs of the same round
cd /work/main/bench/local-probes
for r in 1 2 3 4 5; do
  OMP_NUM_THREADS=1 timeout 300 python price.py 2>/dev/null | grep -E "^(dp2 m1|pp2 gpipe m8) " | sed "s/^/round $r price /"
  for w in $( [ $((r % 2)) = 1 ] && echo "pipe dp" || echo "dp pipe" ); do
    if [ $w = pipe ]; then
      STEPS=20 bash lrun.sh q$r --pp 2 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1 --metrics.heldout false > /dev/null
      python -c "import json; s=json.load(open('/tmp/grp/q$r/summary.json')); p=s['pipeline']; print('round $r run pp2 gpipe m8 step_ms', round(s['median_step_time']*1e3,1), 'stage0_cpu_ms', round(p['cpu_per_step_per_rank'][0]*1e3,1))"
    else
      STEPS=20 bash lrun.sh d$r --dp 2 --metrics.heldout false > /dev/null
      python -c "import json; s=json.load(open('/tmp/grp/d$r/summary.json')); print('round $r run dp2 m1 step_ms', round(s['median_step_time']*1e3,1))"
    fi
  done
done
