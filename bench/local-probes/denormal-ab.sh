#!/bin/bash
# FLUSH=1 (torch.set_flush_denormal(True) in each worker, via sitecustomize) against FLUSH=0, in alternating order
D=$(cd "$(dirname "$0")" && pwd)
cd "$D"
F="--pp 2 --pipeline.schedule gpipe --micro-batches 8 --pipeline.split 2,1"
for r in 1 2 3 4 5 6; do
  for f in 0 1; do
    g=$(( (r + f) % 2 ))
    FLUSH=$g PYTHONPATH=$D/denormal bash lrun.sh dn2-r$r-f$g $F
  done
done
