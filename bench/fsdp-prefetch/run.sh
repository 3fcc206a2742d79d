#!/bin/bash
# FSDP's backward prefetch, torch's default against tessel's chain-order lists, on the plan of the head's re-run where
# the extra gather was largest against the step (the classifier's dp2 x FSDP2 x pp3 1F1B m2 on 6 hosts at 500 Mbit/s,
# a third of a core each, bench/plan-head-6h-500): ROUNDS rounds, alternating which runs first, STEPS steps each.
#   bash bench/fsdp-prefetch/run.sh; python bench/fsdp-prefetch/report.py bench/fsdp-prefetch/logs
cd "$(dirname "$0")/../.." || exit 2
out=bench/fsdp-prefetch/logs; mkdir -p $out
plan=bench/plan-head-6h-500/plans/classifier-h6-500mbit/dp2-fsdp2-pp3-tp1-1f1b-m2.json
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['classifier'] + pc.COMMON)))")
for r in $(seq 1 "${ROUNDS:-5}"); do
  order="torch tessel"; [ $((r % 2)) -eq 0 ] && order="tessel torch"
  for p in $order; do
    PREFETCH=$p tessel cluster run --hosts 6 --rate 500mbit --cpus 0.333 --torchrun -- bench/fsdp-prefetch/run.py \
      $flags --plan $plan --train.steps "${STEPS:-12}" > $out/round$r-$p.log 2>&1 || echo "round $r $p failed"
  done
done
