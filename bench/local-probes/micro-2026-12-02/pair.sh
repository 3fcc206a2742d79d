#!/bin/bash
# OLD_SRC: the src folder of a checkout at e32862b (git worktree add DIR e32862b); run from the repository root
# local pp4 GPipe m8 of the cells' Transformer (as share.py), at e32862b (old) and HEAD (new), alternating by round
MODEL="--model transformer_lm --model.layers 4 --model.dim 128 --data.vocab_size 4096 --seq-len 32 --batch 32 --sparse dense --optimizer sgd --lr 0.01 --timeout 120 --metrics.progress log --metrics.plot false --checkpoint.enabled false --metrics.heldout false --metrics.memory false --steps 12"
for r in 0 1 2; do
  if [ $((r % 2)) = 0 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    if [ $which = old ]; then src=$OLD_SRC; else src=$PWD/src; fi
    d=${RUNS:-/tmp/pair-runs}/r$r-$which
    OMP_NUM_THREADS=1 PYTHONPATH=$src python3 -m tessel train $MODEL --pp 4 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1,1,2 --nproc 4 --out $d > $d.log 2>&1
    python3 -c "
import json; s=json.load(open('$d/summary.json')); p=s['pipeline']
print('r$r $which', round(s['median_step_time']*1e3,1), [round(c*1e3,1) for c in p['cpu_per_step_per_rank']])"
  done
done
