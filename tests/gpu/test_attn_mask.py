"""scaled_dot_product_attention's attn_mask: boolean (True: the key takes part) or additive,
broadcast to (batch, heads, seqlen_q, seqlen_k) as PyTorch broadcasts it, on the bias score
modifier's kernels of every family. Output and gradients of query, key and value against the fp32
reference with the same mask; bad masks raise naming the argument."""

from __future__ import annotations

import pytest
import torch

from flashgen import scaled_dot_product_attention
from flashgen.reference import assert_close_fa2, attention_ref
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
    (torch.ones(64, 64, requires_grad=True), {}, NotImplementedError, "no gradient"),
])
def test_bad_masks_name_the_argument(mask, kwargs, error, message):
    query, key, value = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
                         for _ in range(3))
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(query, key, value, attn_mask=mask.cuda().detach()
                                     .requires_grad_(mask.requires_grad), **kwargs)
