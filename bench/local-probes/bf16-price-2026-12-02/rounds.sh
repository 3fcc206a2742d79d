#!/bin/bash
# Per round, for each precision: the price at OLD_SRC (7ac61a4: the real step in float32) and at the working tree,
# and the measured median step of `tessel train` (one process, one thread, 20 steps), the order alternating by round.
# Run from the repository root.
here=bench/local-probes/bf16-price-2026-12-02
M="--model transformer_lm --model.layers 4 --model.dim 128 --data.vocab_size 4096 --seq-len 32 --batch 32 --sparse dense --optimizer sgd --lr 0.01 --metrics.progress log --metrics.plot false --checkpoint.enabled false --metrics.heldout false --metrics.memory false --steps 20"
for r in 0 1 2 3 4; do
  for prec in fp32 bf16-mixed; do
    if [ $((r % 2)) = 0 ]; then order="old new run"; else order="run new old"; fi
    for w in $order; do
      case $w in
        old) echo "r$r $prec old $(OMP_NUM_THREADS=1 PYTHONPATH=$OLD_SRC python3 $here/price.py $prec 2>/dev/null)";;
        new) echo "r$r $prec new $(OMP_NUM_THREADS=1 PYTHONPATH=$PWD/src python3 $here/price.py $prec 2>/dev/null)";;
        run) d=/tmp/bf16-price/r$r-$prec; rm -rf $d
             OMP_NUM_THREADS=1 python3 -m tessel train $M --train.precision $prec --nproc 1 --out $d > /dev/null 2>&1
             echo "r$r $prec run $(python3 -c "import json; print(round(json.load(open('$d/summary.json'))['median_step_time'] * 1e3, 1))") ms";;
      esac
    done
  done
done
