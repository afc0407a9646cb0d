import csv, sys, collections, re
def load(path):
    kernels = []
    rows = list(csv.reader(open(path)))
    i = 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name":
            name = rows[i][1]; hdr = rows[i+1]; body = []
            i += 2
            while i < len(rows) and not (rows[i] and rows[i][0] == "Kernel Name"):
                if len(rows[i]) == len(hdr): body.append(dict(zip(hdr, rows[i])))
                i += 1
            kernels.append((name, hdr, body))
        else: i += 1
    return kernels
def num(x):
    try: return float(x.replace(',',''))
    except: return 0.0
if __name__ == "__main__":
    for name, hdr, body in load(sys.argv[1]):
        print("==", name[:110])
        tot = sum(num(r["Instructions Executed"]) for r in body)
        samp = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in body)
        print(f"instructions {tot:.4g}  samples {samp:.4g}  sass lines {len(body)}")
        ops = collections.Counter(); opsamp = collections.Counter()
        for r in body:
            op = r["Source"].split()[0] if r["Source"].split() else "?"
            if op.startswith("@"): op = r["Source"].split()[1]
            op = op.split(".")[0]
            ops[op] += num(r["Instructions Executed"]); opsamp[op] += num(r["Warp Stall Sampling (All Samples)"])
        for op, c in ops.most_common(28):
            print(f"  {op:10s} {c/tot*100:5.1f}% inst  {opsamp[op]/samp*100:5.1f}% samples")
        stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
        st = {h: sum(num(r[h]) for r in body) for h in stalls}
        print("  stalls:", ", ".join(f"{h[6:]} {v/samp*100:.1f}%" for h, v in sorted(st.items(), key=lambda x: -x[1]) if v/samp > 0.01))
