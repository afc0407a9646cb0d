"""One flashgen and one FLASH_ATTENTION backward, bf16, hd128 causal, the benchmark grid's shape
at seqlen argv[1] (16k tokens, 16 heads), for ncu."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgen import flash_attn_func

seqlen = int(sys.argv[1])
q, k, v = (torch.randn(16384 // seqlen, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16,
                       requires_grad=True) for _ in range(3))
dout = torch.randn(16384 // seqlen, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16)
flash_attn_func(q, k, v, causal=True).backward(dout)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    out.backward(dout.transpose(1, 2))
torch.cuda.synchronize()
