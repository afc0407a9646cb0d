import sys
from ncu_parse import load, num
k = int(sys.argv[2]); n = int(sys.argv[3])
name, hdr, body = load(sys.argv[1])[k]
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in body)
idx = sorted(range(len(body)), key=lambda i: -num(body[i]["Warp Stall Sampling (All Samples)"]))[:n]
for i in sorted(idx):
    r = body[i]
    s = num(r["Warp Stall Sampling (All Samples)"])
    top = sorted(((num(r[h]), h[6:]) for h in stalls), reverse=True)[:2]
    print(f"{i:5d} {s/tot*100:5.2f}% ex={num(r['Instructions Executed']):9.3g} {r['Source'][:60]:60s} {top[0][1]}:{top[0][0]/max(s,1)*100:.0f}% {top[1][1]}")
