#!/bin/bash
# The LSTM on 3 hosts of 2/3 of a core at 1 Gbit/s (bench/plan-unseen6-3h-1g, every candidate priced slow, 8-33%):
# two of its pipelines (pp3 1f1b m1 and m2, as the plan check ran them) taken apart with bench/plan-latency/where.py,
# 30 steps each, then each rank's medians (where.py ranks); and the profile the planner takes of the LSTM, 5 times
# over (profiles.py). Logs and outputs here.
#   bash bench/lstm-3h/run.sh
cd "$(dirname "$0")/../.." || exit 2
out=bench/lstm-3h
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['lstm_lm'] + pc.COMMON)))")
for n in dp1-pp3-tp1-1f1b-m1 dp1-pp3-tp1-1f1b-m2; do
  tessel cluster run --hosts 3 --rate 1gbit --cpus 0.6667 --torchrun -- bench/plan-latency/where.py $flags \
    --plan bench/plan-unseen6-3h-1g/plans/lstm_lm-h3-1gbit/$n.json --train.steps 30 > $out/$n.log 2>&1
done
python bench/plan-latency/where.py ranks $out/*.log > $out/ranks.txt
python $out/profiles.py > $out/profiles.txt
