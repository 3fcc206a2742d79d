#!/bin/bash
F="--pp 2 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1"
for r in $(seq 1 10); do
  if [ $((r % 2)) = 1 ]; then order="true false"; else order="false true"; fi
  for b in $order; do ./lrun.sh bind-$b-$r $F --parallel.bind_cpus $b; done
done
