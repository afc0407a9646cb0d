# Forward correctness at odd sizes (fp32 reference, 2x PyTorch's own error + 1e-5); argv: "64,128" [bf16,fp16]
import sys, torch
from flashgen import flash_attn_func
from flashgen.reference import attention_ref, max_error
torch.manual_seed(0)
fails = 0
for hd in [int(x) for x in sys.argv[1].split(",")]:
    for dt in [getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[d]) for d in (sys.argv[2] if len(sys.argv) > 2 else "bf16,fp16").split(",")]:
        for causal in (False, True):
            for (b, sq, sk, h, hk) in [(2, 257, 311, 4, 2), (1, 1024, 1024, 8, 8), (2, 300, 100, 4, 1),
                                       (1, 1, 17, 2, 2), (1, 113, 113, 2, 1), (3, 1000, 2049, 4, 4)]:
                q = torch.randn(b, sq, h, hd, device="cuda", dtype=dt)
                k = torch.randn(b, sk, hk, hd, device="cuda", dtype=dt)
                v = torch.randn(b, sk, hk, hd, device="cuda", dtype=dt)
                out = flash_attn_func(q, k, v, causal=causal)
                r32, _ = attention_ref(q, k, v, causal=causal, upcast=True)
                r16, _ = attention_ref(q, k, v, causal=causal, upcast=False)
                err, budget = max_error(out, r32), 2 * max_error(r16, r32) + 1e-5
                fails += not err <= budget
                if not err <= budget:
                    print(f"FAIL hd{hd} {dt} causal={causal} {(b, sq, sk, h, hk)} {err:.2e} > {budget:.2e}")
print("FWD FAILS", fails)
