"""Calls flashgen's forward over several specialisations at odd sizes, for compute-sanitizer.
Checks each result too, so a clean report also means a right answer. The references run on the
CPU: under racecheck a cuBLAS kernel hit a hardware exception the sanitizer could not handle."""

import itertools

import torch

from flashgen import flash_attn_func
from flashgen.reference import assert_close_fa2, attention_ref

# (batch, seqlen_q, seqlen_k, heads, heads_kv): ragged edges, GQA, rows that see no key.
SHAPES = [(1, 1, 1, 2, 1), (2, 17, 113, 4, 2), (1, 239, 64, 2, 2)]
# One spec per tile shape of the default sm_90 table, both dtypes among them.
SPECS = [(torch.bfloat16, 32), (torch.float16, 64), (torch.bfloat16, 96), (torch.float16, 128),
         (torch.bfloat16, 192), (torch.float16, 256)]

torch.manual_seed(0)
calls = 0
for (dtype, head_dim), causal, (batch, seqlen_q, seqlen_k, heads, heads_kv) in itertools.product(
        SPECS, (False, True), SHAPES):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    out = flash_attn_func(q, k, v, causal=causal).cpu()
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    assert_close_fa2(out, attention_ref(q, k, v, causal)[0],
                     attention_ref(q, k, v, causal, upcast=False)[0])
    calls += 1
print(f"sanitize_driver: {calls} checked calls")
