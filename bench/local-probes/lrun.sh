#!/bin/bash
n=$1; shift
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
timeout 600 python -m tessel train --nproc ${NP:-2} --model lstm_lm --model.dim 64 --model.hidden 256 --data.vocab_size 4096 --seq-len 32 --batch 32 --sparse dense --optimizer sgd --lr 0.01 --metrics.progress log --metrics.plot false --checkpoint.enabled false --steps ${STEPS:-20} --out /tmp/grp/$n "$@" > /tmp/grp/$n.log 2>&1
echo "$n $(grep 'step time' /tmp/grp/$n.log)"
