"""Summarize abba.sh's output (argument: its file): per code version, the profiles' seconds, and per cell the picks'
measured time over the best's, the step factors, median and worst errors; the candidates' price spreads."""
import collections
import json
import re
import statistics
import sys

cur, data, spreads = None, collections.defaultdict(lambda: collections.defaultdict(list)), collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("## "):
        cur = line.split()[1]
        continue
    if line.startswith("{"):
        d = json.loads(line)
        data[cur][d["cell"]].append(d)
    m = re.search(r"\(x([0-9.]+)\)", line)
    if m:
        spreads[cur].append(float(m.group(1)))
for which in ("old", "new"):
    secs = [x["seconds"] for c in data[which].values() for x in c]
    print(f"{which}: profile seconds median {statistics.median(secs):.1f} ({min(secs)}-{max(secs)})")
    for cell, xs in data[which].items():
        sf = [x["step_factor"] for x in xs]
        print(f"  {cell:26s} picks over best {[x['pick/best measured'] for x in xs]}; step factor {min(sf)}-{max(sf)}; "
              f"median |err| {[x['median |err| %'] for x in xs]}; worst {[x['worst %'] for x in xs]}")
    s = spreads[which]
    print(f"  a candidate's price over 4 profiles, max/min: median {statistics.median(s):.2f}, worst {max(s):.2f}")
