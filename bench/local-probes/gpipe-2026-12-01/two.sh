# $1 schedule, $2 out, hosts $H (cpus cores/hosts), pp = H
tessel cluster run --hosts $H --rate ${RATE:-200mbit} --timeout 300 --torchrun -- -m tessel train --model.name transformer_lm --model.layers 4 --model.dim 128 --data.vocab_size 4096 --data.seq_len 32 --train.global_batch 32 --sparse.strategy dense --train.optimizer sgd --train.lr 0.01 --metrics.progress log --metrics.plot false --checkpoint.enabled false --train.steps 12 --pp $H --pipeline.schedule $1 --micro-batches 8 --out $2 > $2.log 2>&1
python - $2 <<'PY'
import json,sys
s=json.load(open(sys.argv[1]+'/summary.json')); p=s['pipeline']
print(sys.argv[1], 'step', round(s['median_step_time']*1e3,1), 'cpu', [round(x*1e3) for x in p['cpu_per_step_per_rank']], 'waits act', [round(x*1e3) for x in p['wait_activation_per_rank']], 'grad', [round(x*1e3) for x in p['wait_grad_per_rank']])
PY
