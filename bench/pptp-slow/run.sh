#!/bin/bash
# The two pp x tp plans the head prices slow beyond 30% (docs/benchmarks.md, "Where every cell stands"), taken
# apart with bench/plan-latency/where.py on their own clusters: the Transformer's dp1 pp2 tp2 1d m4 on 4 hosts at
# 300 Mbit/s (priced 367 ms, measured 269; cell bench/plan-micro-4h-300) and dp1 pp3 tp2 1d m1 on 6 hosts at
# 500 Mbit/s (priced 450, measured 320; cell bench/plan-head-6h-500), each beside a plan of its cell priced within
# 30% (tp4 2d on 4 hosts, pp3 tp2 m4 on 6). 30 steps each; step 20's calls one by one. Writes where-<cell>-<plan>.log
# and .txt here.
#   bash bench/pptp-slow/run.sh
cd "$(dirname "$0")/../.." || exit 2
out=bench/pptp-slow
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['transformer_lm'] + pc.COMMON)))")
run() {  # cell hosts rate plan
  local plan=bench/$1/plans/transformer_lm-h$2-$3/$4.json n=$1-$4
  WHERE_EACH=20 tessel cluster run --hosts "$2" --rate "$3" --torchrun -- bench/plan-latency/where.py $flags \
    --plan "$plan" --train.steps 30 > $out/where-$n.log 2>&1
  python bench/plan-latency/where.py report $out/where-$n.log > $out/where-$n.txt
}
run plan-micro-4h-300 4 300mbit dp1-pp2-tp2-1d-1f1b-m4
run plan-micro-4h-300 4 300mbit dp1-pp1-tp4-2d-2x2-m1
run plan-head-6h-500 6 500mbit dp1-pp3-tp2-1d-1f1b-m1
run plan-head-6h-500 6 500mbit dp1-pp3-tp2-1d-1f1b-m4
