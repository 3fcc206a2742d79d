#!/bin/bash
# before (worktree of the commit before) and after (this tree), alternating, 10 rounds per model
for m in classifier transformer; do
  for r in $(seq 1 10); do
    for w in $( [ $((r % 2)) = 1 ] && echo "before after" || echo "after before" ); do
      pp=src; [ $w = before ] && pp=$BEFORE/src
      echo "$m $r $w $(PYTHONPATH=$pp OMP_NUM_THREADS=1 python bench/local-probes/predict-2026-11-30/stage0.py $m)"
    done
  done
done
