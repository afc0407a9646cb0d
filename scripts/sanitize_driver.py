"""Calls flashgen's forward over several specialisations at odd sizes, for compute-sanitizer.
Checks each result too, so a clean report also means a right answer."""

import torch

from flashgen import flash_attn_func
from tests.reference import assert_close_fa2, attention_ref

SHAPES = [(1, 1, 1, 2, 1), (2, 17, 113, 4, 2), (1, 239, 64, 2, 2), (1, 130, 300, 2, 1)]

torch.manual_seed(0)
calls = 0
for dtype in (torch.float16, torch.bfloat16):
    for head_dim in (32, 64, 96, 128, 192, 256):
        for causal in (False, True):
            for batch, seqlen_q, seqlen_k, heads, heads_kv in SHAPES:
                q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
                k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
                v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
                out = flash_attn_func(q, k, v, causal=causal)
                assert_close_fa2(out, attention_ref(q, k, v, causal)[0],
                                 attention_ref(q, k, v, causal, upcast=False)[0])
                calls += 1
torch.cuda.synchronize()
print(f"sanitize_driver: {calls} checked calls")
