"""rounds.txt -> per precision and code, each round's price over that round's measured step; median and range."""
import collections
import re
import statistics

price, run = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open("rounds.txt"):
    r, prec, who, rest = line.split(maxsplit=3)
    ms = float(re.search(r"([0-9.]+) ms", rest).group(1))
    (run if who == "run" else price[(prec, who)])[(r, prec)] = ms
for (prec, who), got in sorted(price.items()):
    ratios = [got[k] / run[k] for k in sorted(got)]
    print(f"{prec:10s} {who}: price over measured, by round {[round(x, 2) for x in ratios]}; median "
          f"{statistics.median(ratios):.2f}, median |error| {statistics.median(abs(x - 1) for x in ratios) * 100:.0f}%")
