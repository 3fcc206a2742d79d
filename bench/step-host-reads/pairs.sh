# the one-process step before (851e6e9, a worktree at /tmp/old: git worktree add /tmp/old 851e6e9) and after the
# change that keeps the norm, clip factor and loss on the device (413a20f), in turn, the first of each pair
# alternating; each number is the median of 20 steps after 3 (bench/plan-trial-3/steptime.py, one thread)
for m in classifier transformer_lm; do
  for i in 1 2 3 4 5; do
    o() { PYTHONPATH=/tmp/old/src python bench/plan-trial-3/steptime.py $m; }
    n() { PYTHONPATH=/work/main/src python bench/plan-trial-3/steptime.py $m; }
    if [ $((i % 2)) = 1 ]; then a=$(o); b=$(n); else b=$(n); a=$(o); fi
    echo "$m old $a new $b"
  done
done
