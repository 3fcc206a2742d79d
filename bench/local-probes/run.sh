#!/bin/bash
# usage: run.sh NAME LAYERS extra flags...
n=$1; l=$2; shift 2
export MALLOC_MMAP_THRESHOLD_=${MT:-131072} MALLOC_TRIM_THRESHOLD_=${MT:-131072} OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
timeout 600 python -m tessel train --nproc 8 --model transformer_lm --model.dim 256 --model.heads 8 --data.vocab_size 512 --seq-len 32 --batch 16 --sparse dense ${OPT:---optimizer adamw} --metrics.progress log --metrics.plot false --checkpoint.enabled false --model.layers $l --steps 3 --out /tmp/grp/$n "$@" > /tmp/grp/$n.log 2>&1
python - /tmp/grp/$n <<'P'
import json,sys
s=json.load(open(sys.argv[1]+'/summary.json'))
rss=s['peak_mem_per_rank']; t=s['step_peak_mem_per_rank']
print(sys.argv[1], 'rss-tensors', [round((a-b)/2**20,1) for a,b in zip(rss,t)], 'tensors', round(max(t)/2**20,1))
P
