# one run: $1 schedule (gpipe|1f1b), $2 out dir; the bench's Transformer cell, pp4 m8 on 4 hosts at 200 Mbit/s
P=/work/main/bench/plan/plans/transformer_lm-h4-200mbit/dp1-pp4-tp1-$1-m8.json
tessel cluster run --hosts 4 --rate ${RATE:-200mbit} --timeout 300 --torchrun -- -m tessel train --model.name transformer_lm --model.layers 4 --model.dim 128 --data.vocab_size 4096 --data.seq_len 32 --train.global_batch 32 --sparse.strategy dense --train.optimizer sgd --train.lr 0.01 --metrics.progress log --metrics.plot false --checkpoint.enabled false --train.steps ${STEPS:-10} --plan $P --out $2 > $2.log 2>&1
python - $2 <<'PY'
import json,sys
s=json.load(open(sys.argv[1]+'/summary.json')); p=s.get('pipeline',{})
print(sys.argv[1], 'step', round(s['median_step_time']*1e3,1), 'cpu', [round(x*1e3) for x in p.get('cpu_per_step_per_rank',[])], 'keys', [k for k in p])
PY
