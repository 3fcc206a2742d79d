#!/bin/bash
# Where the LSTM's FSDP steps go on 8 hosts of a quarter of a core at 1 Gbit/s (the plan check's cell
# bench/plan-head-lstm-8h, whose FSDP plans are priced 32-47% fast at the head), with bench/plan-latency/where.py:
# its dp8 x FSDP4 (HSDP, 2 replicas) beside dp8 DDP, 60 steps each, host 1's cpu group's cpu.stat sampled every
# 0.25 s from outside the cluster (its namespace hides it from the job); then the same pair as dp2 on 2 hosts of a
# whole core at 10 Gbit/s; then FSDP2's own work on a world of one (own_work.py). Writes where-<plan>.log/.txt,
# throttle-<plan>.tsv (seconds, nr_periods, nr_throttled, throttled ns; throttle.py reads them) and own_work.txt here.
#   bash bench/fsdp-quarter/run.sh
cd "$(dirname "$0")/../.." || exit 2
out=bench/fsdp-quarter
flags=$(python -c "from tessel.bench import plan_check as pc; print(' '.join(pc._flags(pc.MODELS['lstm_lm'] + pc.COMMON)))")
for plan in bench/plan-head-lstm-8h/plans/lstm_lm-h8-1gbit/dp8-fsdp4-pp1-tp1-m1.json $out/dp8-pp1-tp1-m1.json; do
  n=$(basename "$plan" .json)
  ( while true; do
      f=$(ls -d /sys/fs/cgroup/cpu/tessel/tsl-h1 2>/dev/null)
      [ -n "$f" ] && echo "$(date +%s.%N) $(awk '{printf "%s ", $2}' $f/cpu.stat)"
      sleep 0.25
    done ) > $out/throttle-$n.tsv &
  poll=$!
  WHERE_EACH=30 tessel cluster run --hosts 8 --rate 1gbit --cpus 0.25 --torchrun -- bench/plan-latency/where.py \
    $flags --plan "$plan" --train.steps 60 > $out/where-$n.log 2>&1
  kill $poll
  python bench/plan-latency/where.py report $out/where-$n.log > $out/where-$n.txt
  python $out/throttle.py $out/throttle-$n.tsv --last 12 > $out/throttle-$n.txt
done
for plan in $out/dp2-fsdp2-pp1-tp1-m1.json $out/dp2-fsdp1-pp1-tp1-m1.json; do
  n=$(basename "$plan" .json)
  tessel cluster run --hosts 2 --rate 10gbit --cpus 1 --torchrun -- bench/plan-latency/where.py $flags --plan "$plan" \
    --train.steps 30 > $out/where-$n.log 2>&1
  python bench/plan-latency/where.py report $out/where-$n.log > $out/where-$n.txt
done
python $out/own_work.py > $out/own_work.txt
