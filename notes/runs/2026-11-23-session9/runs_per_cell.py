# Per backward cell (seqlen 2k-16k), flashgen / FLASH_ATTENTION in each of several bench runs
# (results.json files given as argv), their median and minimum; the cells sorted by median.
import json
import statistics
import sys


def ratios(path):
    cells = json.load(open(path))["cells"]
    return {(c["dtype"], c["head_dim"], "causal" if c["causal"] else "full", c["seqlen"]):
            c["results"]["flashgen"]["tflops"] / c["results"]["FLASH_ATTENTION"]["tflops"]
            for c in cells if c["mode"] == "bwd" and c["seqlen"] >= 2048}


runs = [ratios(path) for path in sys.argv[1:]]
rows = sorted((statistics.median(r[key] for r in runs), key) for key in runs[0])
for median, key in rows:
    values = " ".join(f"{r[key]:.3f}" for r in runs)
    print(f"{key[0]} hd{key[1]:<3d} {key[2]:6s} {key[3]:6d}  median {median:.3f}  runs {values}")
for head_dims in ((64, 128), (256,)):
    medians = [m for m, key in rows if key[1] in head_dims]
    lows = [min(r[key] for r in runs) for _, key in rows if key[1] in head_dims]
    below = sum(r[key] < 1.0 for r in runs for _, key in rows if key[1] in head_dims)
    print(f"head dims {head_dims}: per-cell medians {min(medians):.3f}-{max(medians):.3f}, "
          f"lowest single run {min(lows):.3f}, {below} of {len(medians) * len(runs)} cell-runs < 1.0")
