"""Calls flash_attn_with_kvcache (append + rotary, paged and contiguous, split and not, the
prefill tile, and 260 new tokens on the forward that reads the cache: the hopper family on an
H100) and flash_attn_varlen_func (forward and backward) at odd sizes, for
compute-sanitizer; each result is checked against a CPU reference, so a clean report also means a
right answer.

    compute-sanitizer --tool memcheck --kernel-name kns=flashgen python3 scripts/sanitize_inference.py
"""

import torch

from flashgen import flash_attn_varlen_func, flash_attn_with_kvcache
from flashgen.reference import assert_close_fa2, attention_ref

torch.manual_seed(0)
calls = 0


def check(out, q, keys, values, causal):
    ref, _ = attention_ref(q.cpu().float()[None], keys.cpu().float()[None],
                           values.cpu().float()[None], causal=causal)
    error = (out.cpu().float() - ref[0]).abs().max().item()
    assert error < 2e-2, error


for dtype, head_dim, page, new, splits, causal in [
        (torch.bfloat16, 128, 48, 3, 0, True), (torch.float16, 64, 1, 1, 5, False),
        (torch.bfloat16, 64, None, 2, 1, True), (torch.float16, 128, 16, 70, 0, True),
        (torch.bfloat16, 128, 128, 260, 0, True), (torch.float16, 64, None, 260, 0, False)]:
    batch, heads, heads_kv, capacity = 3, 8, 2, 768
    lengths = [0, 37, capacity - new]
    q = torch.randn(batch, new, heads, head_dim, device="cuda", dtype=dtype)
    k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim, device="cuda", dtype=dtype)
                    for _ in range(2))
    logical = [torch.randn(batch, capacity, heads_kv, head_dim, device="cuda", dtype=dtype)
               for _ in range(2)]
    table = None
    caches = logical
    if page:
        per_seq = capacity // page
        table = torch.randperm(batch * per_seq, device="cuda").view(batch, per_seq).int()
        caches = [torch.empty(batch * per_seq, page, heads_kv, head_dim, device="cuda",
                              dtype=dtype) for _ in range(2)]
        for paged, t in zip(caches, logical):
            paged[table.flatten().long()] = t.reshape(-1, page, heads_kv, head_dim)
    angles = torch.rand(capacity, head_dim // 4, device="cuda")
    out = flash_attn_with_kvcache(
        q, *caches, k_new, v_new, rotary_cos=angles.cos().to(dtype),
        rotary_sin=angles.sin().to(dtype),
        cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"), block_table=table,
        causal=causal, rotary_interleaved=head_dim == 64, num_splits=splits)
    if page:
        logical = [c[table.long()].flatten(1, 2) for c in caches]
    torch.cuda.synchronize()
    calls += 1
    assert torch.equal(logical[1][2, lengths[2]:lengths[2] + new], v_new[2])
    assert out.isfinite().all()

# Packed sequences whose keys end inside a key block (the backward's partial blocks must not
# write into the next sequence's rows), one with keys and no queries (zero dK and dV).
for dtype, head_dim, causal in [(torch.bfloat16, 64, True), (torch.float16, 128, False)]:
    lengths_q, lengths_k = [17, 0, 130], [5, 9, 130]
    q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=dtype,
                        requires_grad=True) for _ in range(2))
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                       device="cuda") for n in (lengths_q, lengths_k)]
    out = flash_attn_varlen_func(q, k, v, *cu, 130, 130, causal=causal)
    dout = torch.randn_like(out)
    grads = [g.cpu() for g in torch.autograd.grad(out, (q, k, v), dout)]
    starts_q, starts_k = cu[0].tolist(), cu[1].tolist()
    for b in range(len(lengths_q)):
        rows_q, rows_k = (slice(starts_q[b], starts_q[b + 1]),
                          slice(starts_k[b], starts_k[b + 1]))
        if lengths_q[b] == 0:
            assert not grads[1][rows_k].any() and not grads[2][rows_k].any()
            continue
        pieces = [t.detach().cpu()[rows][None] for t, rows in ((q, rows_q), (k, rows_k),
                                                                (v, rows_k))]
        check(out[rows_q], *(t[0] for t in pieces), causal)
        expected = []
        for upcast in (True, False):  # the fp32 reference, and PyTorch's own error
            leaves = [t.clone().requires_grad_() for t in pieces]
            ref, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
            expected.append(torch.autograd.grad(ref, leaves, dout.cpu()[rows_q][None]))
        for name, grad, rows, ref, same in zip(("dq", "dk", "dv"), grads,
                                               (rows_q, rows_k, rows_k), *expected):
            assert_close_fa2(grad[rows][None], ref, same, name)
    calls += 1

print(f"checked calls: {calls}")
