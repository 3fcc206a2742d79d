P=/work/main/bench/plan-unseen-6h-200/plans/classifier-h6-200mbit/dp1-pp3-tp2-1d-$1-m4.json
tessel cluster run --hosts 6 --rate 200mbit --timeout 300 --torchrun -- -m tessel train --model.name classifier --model.layers 4 --model.hidden 1024 --model.in_features 1024 --train.global_batch 64 --train.optimizer sgd --train.lr 0.01 --metrics.progress log --metrics.plot false --checkpoint.enabled false --train.steps 10 --plan $P --out $2 > $2.log 2>&1
python - $2 <<'PY'
import json,sys
s=json.load(open(sys.argv[1]+'/summary.json')); p=s['pipeline']
print(sys.argv[1], 'step', round(s['median_step_time']*1e3,1), 'cpu', [round(x*1e3) for x in p['cpu_per_step_per_rank']], 'act', [round(x*1e3) for x in p['wait_activation_per_rank']], 'grad', [round(x*1e3) for x in p['wait_grad_per_rank']], 'stage_of_rank', p['stage_of_rank'])
PY
