import math, sys, time, torch
import torch.nn.functional as F
from flashgen import flash_attn_func
from flashgen import backward as B
from flashgen.reference import attention_ref, max_error

torch.manual_seed(0)
dt = torch.bfloat16
fails = 0
def ref_grads(q, k, v, dout, causal, upcast):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, _ = attention_ref(qq, kk, vv, causal=causal, upcast=upcast)
    out.backward(dout)
    return qq.grad, kk.grad, vv.grad

for hd in [int(x) for x in sys.argv[1].split(",")]:
    for causal in (False, True):
        for (b, sq, sk, h, hk) in [(2, 257, 311, 4, 2), (1, 1024, 1024, 8, 8), (2, 300, 100, 4, 1), (1, 1, 17, 2, 2), (1, 113, 113, 2, 1)]:
            q = torch.randn(b, sq, h, hd, device="cuda", dtype=dt)
            k = torch.randn(b, sk, hk, hd, device="cuda", dtype=dt)
            v = torch.randn(b, sk, hk, hd, device="cuda", dtype=dt)
            dout = torch.randn(b, sq, h, hd, device="cuda", dtype=dt)
            with torch.no_grad():
                out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            for det in (False, True):
                g = B.backward(dout, q, k, v, out, lse, "bf16", 1 / math.sqrt(hd), causal, sk - sq, det, False)
                torch.cuda.synchronize()
                r32 = ref_grads(q, k, v, dout, causal, True)
                r16 = ref_grads(q, k, v, dout, causal, False)
                msgs = []
                for name, a, r, s in zip("qkv", g, r32, r16):
                    err = max_error(a, r); budget = 2 * max_error(s, r) + 1e-5
                    ok = err <= budget
                    fails += not ok
                    msgs.append(f"d{name} {err:.2e}/{budget:.2e}{'' if ok else ' FAIL'}")
                print(f"hd{hd} causal={causal} det={det} {(b,sq,sk,h,hk)}: " + "  ".join(msgs), flush=True)

# timing hd128 / hd64 seqlen 4096 vs FA2
from torch.nn.attention import SDPBackend, sdpa_kernel
for hd in [int(x) for x in sys.argv[1].split(",")]:
  for causal in (False, True):
    b, s, h = 4, 4096, 2048 // hd
    q, k, v, dout = (torch.randn(b, s, h, hd, device="cuda", dtype=dt) for _ in range(4))
    with torch.no_grad():
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    def ours(): B.backward(dout, q, k, v, out, lse, "bf16", 1 / math.sqrt(hd), causal, 0, False, False)
    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        def fa2(): torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)
        res = {}
        for name, fn in (("flashgen", ours), ("FA2", fa2)):
            for _ in range(3): fn()
            ts = []
            for _ in range(10):
                s0, e0 = torch.cuda.Event(True), torch.cuda.Event(True)
                s0.record(); fn(); e0.record(); e0.synchronize(); ts.append(s0.elapsed_time(e0))
            ms = sorted(ts)[5]
            flops = 2.5 * 4 * b * h * s * s * hd / (2 if causal else 1)
            res[name] = flops / ms / 1e9
    print(f"bwd hd{hd} causal={causal} s4096: flashgen {res['flashgen']:.1f} FA2 {res['FA2']:.1f} TFLOP/s ratio {res['flashgen']/res['FA2']:.2f}", flush=True)
print("FAILS", fails)
