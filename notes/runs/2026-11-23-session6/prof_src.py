"""One flashgen and one FLASH_ATTENTION call, bf16, seqlen 4096, batch 4, heads x head dim = 2048,
for ncu. usage: prof_src.py fwd|bwd causal(0|1) head_dim"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgen import flash_attn_func

mode, causal, head_dim = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
q, k, v = (torch.randn(4, 4096, 2048 // head_dim, head_dim, device="cuda", dtype=torch.bfloat16,
                       requires_grad=mode == "bwd") for _ in range(3))
out = flash_attn_func(q, k, v, causal=causal)
if mode == "bwd":
    out.backward(torch.randn_like(out))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
    if mode == "bwd":
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
