#!/bin/bash
# rounds of alternating malloc settings; prints median step ms per run
for r in 1 2 3 4; do
  for cfg in default mm32 mm32trim; do
    case $cfg in
      default) E="";;
      mm32) E="MALLOC_MMAP_THRESHOLD_=33554432";;
      mm32trim) E="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456";;
    esac
    for w in g8 dp2m4; do
      if [ $w = g8 ]; then F="--pp 2 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1"; else F="--dp 2 --micro-batches 4"; fi
      env $E ./lrun.sh ab-$w-$cfg-$r $F
    done
  done
done
