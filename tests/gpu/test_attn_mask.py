"""scaled_dot_product_attention's attn_mask: boolean (True: the key takes part) or additive,
broadcast to (batch, heads, seqlen_q, seqlen_k) as PyTorch broadcasts it, on the bias score
modifier's kernels of every family. Output and gradients of query, key and value against the fp32
reference with the same mask; an additive mask that requires grad gets its gradient (the mma
family's backward writes it); bad masks raise naming the argument."""

from __future__ import annotations

import pytest
import torch

from flashgen import scaled_dot_product_attention
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref
from tests.gpu.test_backward import assert_grads_close

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

BATCH, HEADS, SEQLEN_Q, SEQLEN_K = 2, 4, 300, 517
# name -> (mask shape, boolean)
MASKS = {
    "full_bool": ((BATCH, HEADS, SEQLEN_Q, SEQLEN_K), True),
    "padding_bool": ((BATCH, 1, 1, SEQLEN_K), True),
    "shared_additive": ((SEQLEN_Q, SEQLEN_K), False),
    "per_head_additive": ((1, HEADS, SEQLEN_Q, SEQLEN_K), False),
}


def make_mask(shape, boolean: bool):
    if boolean:
        mask = torch.rand(shape, device="cuda") > 0.3
        mask[..., 0] = True  # every row sees a key
        return mask
    return torch.randn(shape, device="cuda")


@pytest.mark.parametrize("case", sorted(MASKS))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_and_gradients_match_the_reference(dtype, head_dim, case, each_family):
    shape, boolean = MASKS[case]
    mask = make_mask(shape, boolean)
    query = torch.randn(BATCH, HEADS, SEQLEN_Q, head_dim, device="cuda", dtype=dtype,
                        requires_grad=True)
    key, value = (torch.randn(BATCH, HEADS, SEQLEN_K, head_dim, device="cuda", dtype=dtype,
                              requires_grad=True) for _ in range(2))
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask)
    assert out.shape == query.shape
    # The reference on (batch, seq, heads, dim) views, the mask as its bias or visibility.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    reference = dict(causal=False, causal_offset=0)
    reference["visible" if boolean else "score_bias"] = mask
    out_ref, _ = attention_ref(q, k, v, **reference)
    out_pt, _ = attention_ref(q, k, v, upcast=False, **reference)
    assert_close_fa2(out.transpose(1, 2), out_ref, out_pt, "out")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (query, key, value), dout)
    assert_grads_close(tuple(g.transpose(1, 2) for g in grads), q, k, v, dout.transpose(1, 2),
                       **reference)


@pytest.mark.parametrize("shape, mask_dtype", [
    ((BATCH, HEADS, SEQLEN_Q, SEQLEN_K), torch.float32),
    ((1, HEADS, SEQLEN_Q, SEQLEN_K), torch.float32),
    ((BATCH, 1, 1, SEQLEN_K), torch.float32),
    ((SEQLEN_Q, SEQLEN_K), torch.float16),
], ids=["full", "per_head", "padding", "shared_fp16"])
@pytest.mark.parametrize("heads_kv", [HEADS, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_an_additive_mask_that_requires_grad_gets_its_gradient(dtype, heads_kv, shape,
                                                               mask_dtype, each_family):
    mask = torch.randn(shape, device="cuda", dtype=mask_dtype, requires_grad=True)
    query = torch.randn(BATCH, HEADS, SEQLEN_Q, 64, device="cuda", dtype=dtype,
                        requires_grad=True)
    key, value = (torch.randn(BATCH, heads_kv, SEQLEN_K, 64, device="cuda", dtype=dtype,
                              requires_grad=True) for _ in range(2))
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                       enable_gqa=heads_kv != HEADS)
    dout = torch.randn_like(out)
    *grads, dmask = torch.autograd.grad(out, (query, key, value, mask), dout)
    assert dmask.shape == mask.shape and dmask.dtype == mask.dtype

    views = [t.detach().transpose(1, 2) for t in (query, key, value)]

    def reference(upcast: bool):
        leaf = mask.detach().float().requires_grad_()
        ref, _ = attention_ref(*views, causal=False, causal_offset=0, score_bias=leaf,
                               upcast=upcast)
        return torch.autograd.grad(ref, leaf, dout.transpose(1, 2))[0]

    assert_close_fa2(dmask.float(), reference(True), reference(False), "dmask",
                     eps=GRADIENT_EPS)
    assert_grads_close(tuple(g.transpose(1, 2) for g in grads), *views, dout.transpose(1, 2),
                       causal=False, causal_offset=0, score_bias=mask.detach().float())


def test_a_mask_beside_frozen_inputs_gets_its_gradient():
    """Only the mask requires grad (a learned bias over frozen queries, keys and values): the
    call still records its graph."""
    mask = torch.randn(1, HEADS, SEQLEN_Q, SEQLEN_K, device="cuda", requires_grad=True)
    query, key, value = (torch.randn(BATCH, HEADS, s, 64, device="cuda", dtype=torch.bfloat16)
                         for s in (SEQLEN_Q, SEQLEN_K, SEQLEN_K))
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask)
    assert out.requires_grad
    dout = torch.randn_like(out)
    (dmask,) = torch.autograd.grad(out, mask, dout)
    views = [t.transpose(1, 2) for t in (query, key, value)]

    def reference(upcast: bool):
        leaf = mask.detach().requires_grad_()
        ref, _ = attention_ref(*views, causal=False, causal_offset=0, score_bias=leaf,
                               upcast=upcast)
        return torch.autograd.grad(ref, leaf, dout.transpose(1, 2))[0]

    assert_close_fa2(dmask, reference(True), reference(False), "dmask", eps=GRADIENT_EPS)


def test_the_mask_gradient_is_deterministic():
    mask = torch.randn(1, HEADS, SEQLEN_Q, SEQLEN_K, device="cuda", requires_grad=True)
    query, key, value = (torch.randn(BATCH, HEADS, s, 64, device="cuda", dtype=torch.bfloat16,
                                     requires_grad=True)
                         for s in (SEQLEN_Q, SEQLEN_K, SEQLEN_K))
    dout = torch.randn(BATCH, HEADS, SEQLEN_Q, 64, device="cuda", dtype=torch.bfloat16)

    def gradients():
        out = scaled_dot_product_attention(query, key, value, attn_mask=mask)
        return torch.autograd.grad(out, (query, key, value, mask), dout)

    first = gradients()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [gradients() for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert torch.equal(first[3], runs[0][3])  # the mask's gradient is written, not added


def test_rows_the_mask_hides_entirely_give_zero():
    query, key, value = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
                         for _ in range(3))
    mask = torch.ones(64, 64, dtype=torch.bool, device="cuda")
    mask[5] = False
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask)
    assert torch.equal(out[:, :, 5], torch.zeros_like(out[:, :, 5]))
    assert not out.isnan().any()


@pytest.mark.parametrize("mask, kwargs, error, message", [
    (torch.ones(3, 64, 64, dtype=torch.bool), {}, ValueError, "does not broadcast"),
    (torch.ones(64, 64, dtype=torch.int32), {}, TypeError, "boolean or floating point"),
    (torch.ones(64, 64, dtype=torch.bool), {"is_causal": True}, ValueError, "not both"),
])
def test_bad_masks_name_the_argument(mask, kwargs, error, message):
    query, key, value = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
                         for _ in range(3))
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(query, key, value, attn_mask=mask.cuda().detach()
                                     .requires_grad_(mask.requires_grad), **kwargs)
