#!/bin/bash
# ps under pp2 x dp2, 4 hosts, 1 Gbit/s: the 2026-11-25 code (53855b9) against today's (wt2 = 7f? HEAD at the start), alternating
for r in 1 2 3; do
  for rev in old new; do
    if [ $rev = old ]; then src=/tmp/wt-old/src; else src=/tmp/wt2/src; fi
    cd /tmp/grp && PYTHONPATH=$src python -m tessel.cli bench tables-pp --hosts 4 --rates 1gbit --strategies ps --repeats 1 --out /tmp/grp/bis-$rev-$r > /tmp/grp/bis-$rev-$r.log 2>&1
    echo "$rev $r $(grep 'rep 0' /tmp/grp/bis-$rev-$r.log | tail -1)"
  done
done
