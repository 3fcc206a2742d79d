#!/bin/bash
# Two of the head's misses on 2 hosts of a whole core at 100 Mbit/s taken apart with bench/plan-latency/where.py:
# the classifier's dp2 x FSDP2 with recompute (priced 39% fast) and its pp2 gpipe m1 with recompute (priced 39% slow),
# each as `tessel bench plan` ran it in bench/plan-head-2h-100; step 6's calls one by one (WHERE_EACH).
#   bash bench/plan-head/where.sh   (logs and reports in bench/plan-head/where/)
cd "$(dirname "$0")/../.." || exit 2
out=bench/plan-head/where; mkdir -p $out
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['classifier'] + pc.COMMON)))")
for plan in dp2-fsdp2-pp1-tp1-m1-recompute-layers dp1-pp2-tp1-gpipe-m1-recompute-layers; do
  WHERE_EACH=6 tessel cluster run --hosts 2 --rate 100mbit --cpus 1 --torchrun -- bench/plan-latency/where.py $flags \
    --plan bench/plan-head-2h-100/plans/classifier-h2-100mbit/$plan.json --train.steps 10 > $out/cls-$plan.log 2>&1
  python bench/plan-latency/where.py report $out/cls-$plan.log > $out/cls-$plan.txt
done
