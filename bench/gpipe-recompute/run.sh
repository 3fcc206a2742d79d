#!/bin/bash
# The classifier's GPipe m4 with recompute on 5 hosts of 0.4 of a core at 150 Mbit/s, priced 44% fast at the head
# (bench/plan-head/reprice-head5.txt; its 3 rounds in bench/plan-head5-5h-150 ran 65, 139 and 109 ms), taken apart
# with bench/plan-latency/where.py beside the same cell's GPipe m4 and 1F1B m4 with recompute, each twice, in turn;
# then the same stages' pair on 2 hosts of a whole core (pp2 at 10 Gbit/s, the layers cut 3 + 2), the four ways.
# Logs and reports here; per-rank medians by where.py ranks.
#   bash bench/gpipe-recompute/run.sh
cd "$(dirname "$0")/../.." || exit 2
out=bench/gpipe-recompute
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['classifier'] + pc.COMMON)))")
cell=bench/plan-head5-5h-150/plans/classifier-h5-150mbit
for i in 1 2; do
  for n in dp1-pp5-tp1-gpipe-m4-recompute-layers dp1-pp5-tp1-gpipe-m4 dp1-pp5-tp1-1f1b-m4-recompute-layers; do
    WHERE_EACH=12 tessel cluster run --hosts 5 --rate 150mbit --cpus 0.4 --torchrun -- bench/plan-latency/where.py \
      $flags --plan $cell/$n.json --train.steps 30 > $out/$n-$i.log 2>&1
  done
done
for n in pp2-gpipe-plain pp2-gpipe-layers pp2-1f1b-plain pp2-1f1b-layers; do
  tessel cluster run --hosts 2 --rate 10gbit --cpus 1 --torchrun -- bench/plan-latency/where.py $flags \
    --plan $out/$n.json --train.steps 30 > $out/$n.log 2>&1
done
python bench/plan-latency/where.py ranks $out/*.log > $out/ranks.txt
