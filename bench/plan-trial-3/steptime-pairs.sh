# the step tail before (402b658, a worktree at /tmp/old: git worktree add /tmp/old 402b658) and after, in turn
# (the last 5 Transformer pairs in steptime-pairs.log ran the new one first)
for m in classifier transformer_lm; do
  for i in 1 2 3 4 5; do
    o=$(PYTHONPATH=/tmp/old/src python bench/plan-trial-3/steptime.py $m); n=$(PYTHONPATH=/work/main/src python bench/plan-trial-3/steptime.py $m)
    echo "$m old $o new $n"
  done
done
