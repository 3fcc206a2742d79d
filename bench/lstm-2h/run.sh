#!/bin/bash
# The LSTM's pipelines on 2 hosts of a whole core at 100 Mbit/s (cell bench/plan-fsdp-order-2h-100, every pipeline
# priced 9-23% fast at the head), taken apart with bench/plan-latency/where.py on the cell's cluster: its 1f1b m2, m4
# and gpipe m8, 30 steps each, in turn, twice. Writes where-<plan>-<round>.log/.txt here; ranks.txt (each rank's
# medians) comes from where.py ranks.
#   bash bench/lstm-2h/run.sh
cd "$(dirname "$0")/../.." || exit 2
out=bench/lstm-2h
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['lstm_lm'] + pc.COMMON)))")
for round in 1 2; do
  for n in dp1-pp2-tp1-1f1b-m2 dp1-pp2-tp1-1f1b-m4 dp1-pp2-tp1-gpipe-m8; do
    plan=bench/plan-fsdp-order-2h-100/plans/lstm_lm-h2-100mbit/$n.json
    tessel cluster run --hosts 2 --rate 100mbit --torchrun -- bench/plan-latency/where.py $flags --plan "$plan" \
      --train.steps 30 > $out/where-$n-$round.log 2>&1
    python bench/plan-latency/where.py report $out/where-$n-$round.log > $out/where-$n-$round.txt
  done
done
python bench/plan-latency/where.py ranks $out/where-*.log > $out/ranks.txt
