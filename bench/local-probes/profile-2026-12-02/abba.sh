#!/bin/bash
# OLD_SRC: the src folder of a checkout at 7ac61a4 (the profile before rounds)
# repro.py 4 at HEAD's profile (7ac61a4, "old": each size timed in one burst) and the working tree's ("new": sizes
# in turn over 3 rounds), in the order old new new old; run from the repository root
out=bench/local-probes/profile-2026-12-02
for which in old new new old; do
  if [ $which = old ]; then src=$OLD_SRC; else src=$PWD/src; fi
  echo "## $which ($(date -u +%H:%M:%S))"
  PYTHONPATH=$src python3 $out/repro.py 4 2>&1 | grep -v Warn
done
