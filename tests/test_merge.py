"""merge_attention_states: attention over keys A and B from the results over each, exactly; rows
that saw no key on a side; bad input named. Runs on the CPU (the merge is torch ops)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from flashgen import merge_attention_states  # noqa: E402
from flashgen.reference import attention_ref, max_error  # noqa: E402

BATCH, SEQLEN_Q, SEQLEN_K, HEADS, HEADS_KV, HEAD_DIM = 2, 37, 91, 4, 2, 40


def qkv(dtype):
    torch.manual_seed(0)
    q = torch.randn(BATCH, SEQLEN_Q, HEADS, HEAD_DIM, dtype=dtype)
    k = torch.randn(BATCH, SEQLEN_K, HEADS_KV, HEAD_DIM, dtype=dtype)
    return q, k, torch.randn_like(k)


def parts(q, k, v, split: int, causal: bool):
    """attention_ref over keys [0, split) and [split, seqlen_k), the causal mask of the whole
    (bottom-right) carried into each part's offset."""
    offset = SEQLEN_K - SEQLEN_Q
    a = attention_ref(q, k[:, :split], v[:, :split], causal, causal_offset=offset,
                      softmax_scale=HEAD_DIM ** -0.5)
    b = attention_ref(q, k[:, split:], v[:, split:], causal, causal_offset=offset - split,
                      softmax_scale=HEAD_DIM ** -0.5)
    return a, b


@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("split", [1, 40, 90])
def test_merging_two_key_ranges_gives_attention_over_both(split, causal):
    q, k, v = qkv(torch.float32)
    (out_a, lse_a), (out_b, lse_b) = parts(q, k, v, split, causal)
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    expected_out, expected_lse = attention_ref(q, k, v, causal)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert max_error(out, expected_out) < 1e-5
    assert max_error(lse, expected_lse) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_parts_merge_within_their_own_rounding(dtype):
    """Each part rounded to the dtype, as a kernel returns it: the merge adds no error beyond
    twice that rounding plus a tiny epsilon (the rule of the forward's tests)."""
    q, k, v = qkv(torch.float32)
    (out_a, lse_a), (out_b, lse_b) = parts(q, k, v, 50, causal=True)
    out, lse = merge_attention_states(out_a.to(dtype), lse_a, out_b.to(dtype), lse_b)
    expected = attention_ref(q, k, v, True)[0]
    assert out.dtype == dtype
    rounding = max_error(expected.to(dtype), expected)
    assert max_error(out, expected) <= 2 * rounding + 1e-5


def test_rows_that_saw_no_key_on_one_side_take_the_other_sides_result():
    """Under the causal mask the first query rows see none of the keys past the split: lse_b is
    -inf and out_b 0 there."""
    q, k, v = qkv(torch.float32)
    (out_a, lse_a), (out_b, lse_b) = parts(q, k, v, 80, causal=True)
    assert torch.isneginf(lse_b[:, :, 0]).all()
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out[:, 0], out_a[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(lse[:, :, 0], lse_a[:, :, 0], rtol=0, atol=0)


def test_rows_that_saw_no_key_on_either_side_are_zero_with_lse_minus_infinity():
    out_a = torch.randn(1, 3, 2, 8)
    lse_a = torch.full((1, 2, 3), -math.inf)
    out, lse = merge_attention_states(out_a, lse_a, out_a.clone(), lse_a.clone())
    assert torch.isneginf(lse).all()
    assert torch.equal(out, torch.zeros_like(out))


def test_the_merge_is_symmetric_and_returns_new_tensors():
    q, k, v = qkv(torch.float32)
    (out_a, lse_a), (out_b, lse_b) = parts(q, k, v, 30, causal=False)
    ab = merge_attention_states(out_a, lse_a, out_b, lse_b)
    ba = merge_attention_states(out_b, lse_b, out_a, lse_a)
    torch.testing.assert_close(ab, ba)
    assert all(t.data_ptr() not in (out_a.data_ptr(), out_b.data_ptr(), lse_a.data_ptr(),
                                    lse_b.data_ptr()) for t in ab)


def test_strided_outputs_merge_like_contiguous_ones():
    """Outputs laid out (batch, nheads, seqlen, headdim) in memory, as SDPA's are."""
    q, k, v = qkv(torch.float32)
    (out_a, lse_a), (out_b, lse_b) = parts(q, k, v, 45, causal=False)
    heads_first = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (out_a, out_b)]
    strided = merge_attention_states(heads_first[0], lse_a, heads_first[1], lse_b)
    torch.testing.assert_close(strided, merge_attention_states(out_a, lse_a, out_b, lse_b))


def test_a_merge_traces_into_one_graph():
    q, k, v = qkv(torch.float32)
    (out_a, lse_a), (out_b, lse_b) = parts(q, k, v, 45, causal=True)
    compiled = torch.compile(merge_attention_states, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(out_a, lse_a, out_b, lse_b),
                               merge_attention_states(out_a, lse_a, out_b, lse_b))


OUT = torch.zeros(2, 5, 3, 8)
LSE = torch.zeros(2, 3, 5)


@pytest.mark.parametrize("args, error, message", [
    ((OUT.numpy(), LSE, OUT, LSE), TypeError, "out_a must be a torch.Tensor"),
    ((OUT[0], LSE, OUT, LSE), ValueError, r"out_a must be \(batch, seqlen, nheads, headdim\)"),
    ((OUT.int(), LSE, OUT, LSE), TypeError, "out_a has dtype torch.int32"),
    ((OUT, LSE.half(), OUT, LSE), TypeError, "lse_a must be float32"),
    ((OUT, LSE, OUT, LSE.transpose(1, 2)), ValueError,
     r"lse_b must be \(batch, nheads, seqlen\) = \(2, 3, 5\)"),
    ((OUT, LSE, OUT.half(), LSE), ValueError, "out_a and out_b must match"),
    ((OUT, LSE, OUT[:, :4], LSE[:, :, :4]), ValueError, "out_a and out_b must match"),
    ((OUT, LSE.to("meta"), OUT, LSE), ValueError, "lse_a is on meta"),
])
def test_bad_input_is_named(args, error, message):
    with pytest.raises(error, match=message):
        merge_attention_states(*args)
