#!/bin/bash
# pp4 GPipe m8 on 4 local processes (stage 1 = block 1 alone) against block 1 alone in one process, alternating
cd /tmp/s33/prof
for r in 1 2 3 4 5 6; do
  for w in $( [ $((r % 2)) = 1 ] && echo "pipe alone" || echo "alone pipe" ); do
    if [ $w = pipe ]; then
      rm -rf /tmp/s33/prof/p3/$r
      OMP_NUM_THREADS=1 timeout 300 python -m tessel train --model transformer_lm --model.layers 4 --model.dim 128 --data.vocab_size 4096 --seq-len 32 --batch 32 --sparse dense --optimizer sgd --lr 0.01 --metrics.progress log --metrics.plot false --checkpoint.enabled false --metrics.heldout false --metrics.memory false --steps 30 --pp 4 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1,1,2 --nproc 4 --out /tmp/s33/prof/p3/$r > /dev/null 2>&1
      python -c "import json; s=json.load(open('/tmp/s33/prof/p3/$r/summary.json')); p=s['pipeline']; print('round $r pipe stage1_cpu_ms', round(p['cpu_per_step_per_rank'][1]*1e3,1), 'step_ms', round(s['median_step_time']*1e3,1), 'all', [round(x*1e3,1) for x in p['cpu_per_step_per_rank']])"
    else
      OMP_NUM_THREADS=1 python block.py $r 2>/dev/null
    fi
  done
done
