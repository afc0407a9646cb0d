# Forward and backward (atomic and deterministic dQ) against the fp32 reference at odd sizes, GQA,
# under several grid orders (schedule.CAUSAL_RANKS_PER_ROUND; "old" = one round). FlashAttention-2's
# rule: error <= 2 x PyTorch's own same-dtype error + eps. argv: head dims, rounds, dtypes,
# directions (fwd,bwd).
import sys

import torch

from flashgen import backward, flash_attn_func, forward, schedule
from flashgen.reference import GRADIENT_EPS, attention_ref, max_error

torch.manual_seed(0)
SHAPES = [(2, 257, 311, 4, 2), (1, 1024, 1024, 8, 8), (2, 300, 100, 4, 1), (1, 1, 17, 2, 2),
          (3, 1000, 2049, 4, 4), (1, 2048, 2048, 2, 1)]
fails = checks = 0


def check(name, got, r32, r16, eps, where):
    global fails, checks
    err, budget = max_error(got, r32), 2 * max_error(r16, r32) + eps
    checks += 1
    if not err <= budget:
        fails += 1
        print(f"FAIL {name} {where}: {err:.2e} > {budget:.2e}", flush=True)


def ref(q, k, v, dout, causal, upcast):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal, upcast=upcast)
    out.backward(dout)
    return out, [t.grad for t in leaves]


directions = sys.argv[4] if len(sys.argv) > 4 else "fwd,bwd"
for rounds in sys.argv[2].split(","):
    schedule.CAUSAL_RANKS_PER_ROUND = 10**6 if rounds == "old" else int(rounds)
    forward._choose.cache_clear()
    for hd in map(int, sys.argv[1].split(",")):
        for dt in [{"bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in sys.argv[3].split(",")]:
            short = "bf16" if dt == torch.bfloat16 else "fp16"
            for causal in (False, True):
                for b, sq, sk, h, hk in SHAPES:
                    q = torch.randn(b, sq, h, hd, device="cuda", dtype=dt)
                    k, v = (torch.randn(b, sk, hk, hd, device="cuda", dtype=dt) for _ in range(2))
                    dout = torch.randn_like(q)
                    where = f"rounds={rounds} hd{hd} {short} causal={causal} {(b, sq, sk, h, hk)}"
                    with torch.no_grad():
                        out, lse, _ = flash_attn_func(q, k, v, causal=causal,
                                                      return_attn_probs=True)
                    o32, g32 = ref(q, k, v, dout, causal, True)
                    o16, g16 = ref(q, k, v, dout, causal, False)
                    check("out", out, o32, o16, 1e-5, where)
                    for det in (False, True) if "bwd" in directions else ():
                        grads = backward.backward(dout, q, k, v, out, lse, short, hd ** -0.5,
                                                  causal, sk - sq, det, False)
                        for name, g, r, s in zip(("dq", "dk", "dv"), grads, g32, g16):
                            check(f"{name} det={det}", g, r, s, GRADIENT_EPS, where)
print(f"SMOKE checks {checks} fails {fails}")
