"""Calls flashgen's forward and backward over several specialisations at odd sizes, for
compute-sanitizer; with --forward-only, the forward alone (no backward kernels need building);
with --head-dims 64,128 only those head dims' specs; with --dtype bf16 (or fp16) every spec in that
dtype.
Checks each result too, so a clean report also means a right answer. The references run on the
CPU: under racecheck a cuBLAS kernel hit a hardware exception the sanitizer could not handle."""

import itertools
import sys

import torch

from flashgen import flash_attn_func
from flashgen.reference import assert_close_fa2, attention_ref

# (batch, seqlen_q, seqlen_k, heads, heads_kv): ragged edges, GQA, rows that see no key; the
# small ones run the mma forward's block_m 64 alt tiles (flashgen/families/mma/tile_choice.py),
# the others its main tiles; the last has more tiles than an H100 has SMs, so the hopper forward's
# blocks walk tiles (claiming them from the tile counter under the causal mask, with tiles
# without keys among them).
SHAPES = [(1, 1, 1, 2, 1), (2, 17, 113, 4, 2), (1, 239, 64, 2, 2), (4, 300, 257, 8, 2),
          (3, 450, 200, 16, 4)]
# One spec per tile shape of the default sm_90 table, both dtypes among them.
SPECS = [(torch.bfloat16, 32), (torch.float16, 64), (torch.bfloat16, 96), (torch.float16, 128),
         (torch.bfloat16, 192), (torch.float16, 256)]

forward_only = "--forward-only" in sys.argv[1:]
if "--head-dims" in sys.argv[1:]:
    wanted = {int(d) for d in sys.argv[sys.argv.index("--head-dims") + 1].split(",")}
    SPECS = [(dtype, head_dim) for dtype, head_dim in SPECS if head_dim in wanted]
if "--dtype" in sys.argv[1:]:
    only = {"bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[sys.argv.index("--dtype") + 1]]
    SPECS = [(only, head_dim) for _, head_dim in SPECS]
torch.manual_seed(0)
calls = 0
for (dtype, head_dim), causal, (batch, seqlen_q, seqlen_k, heads, heads_kv) in itertools.product(
        SPECS, (False, True), SHAPES):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal)
    calls += 1
    if forward_only:
        cpu = [t.detach().cpu() for t in (q, k, v)]
        assert_close_fa2(out.detach().cpu(), *(attention_ref(*cpu, causal, upcast=upcast)[0]
                                               for upcast in (True, False)))
        continue
    dout = torch.randn_like(out)
    grads = [g.cpu() for g in torch.autograd.grad(out, (q, k, v), dout)]
    cpu = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
    reference, same_dtype = (attention_ref(*cpu, causal, upcast=upcast)[0]
                             for upcast in (True, False))
    assert_close_fa2(out.detach().cpu(), reference.detach(), same_dtype.detach())
    expected = torch.autograd.grad(reference, cpu, dout.cpu())
    own_error = torch.autograd.grad(same_dtype, cpu, dout.cpu())
    for name, grad, ref, same in zip(("dq", "dk", "dv"), grads, expected, own_error):
        assert_close_fa2(grad, ref, same, name)
    # The deterministic path too (semaphores, ordered dQ adds; without a mask the hopper family's
    # turns follow the order the rotated walks reach each query block).
    out = flash_attn_func(q, k, v, causal=causal, deterministic=True)
    grads = [g.cpu() for g in torch.autograd.grad(out, (q, k, v), dout)]
    for name, grad, ref, same in zip(("dq", "dk", "dv"), grads, expected, own_error):
        assert_close_fa2(grad, ref, same, f"deterministic {name}")
    calls += 1
print(f"sanitize_driver: {calls} checked calls")
