for r in 1 2 3 4 5 6; do
  for s in $( [ $((r % 2)) = 1 ] && echo "gpipe 1f1b" || echo "1f1b gpipe" ); do
    STEPS=12 bash one.sh $s /tmp/gp/$s-$r
    python - /tmp/gp/$s-$r <<'PY'
import json,sys
s=json.load(open(sys.argv[1]+'/summary.json')); p=s['pipeline']
print('   waits act', [round(x*1e3) for x in p['wait_activation_per_rank']], 'grad', [round(x*1e3) for x in p['wait_grad_per_rank']], 'bubble', [round(x,2) for x in p['bubble_per_rank']])
PY
  done
done
