"""A readable attention reference and FlashAttention-2's tolerance rule (tests and the tuner)."""

from __future__ import annotations

import functools
import math

import torch


def attention_ref(q, k, v, causal=False, causal_offset=None, softmax_scale=None, upcast=True,
                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  score_bias=None, visible=None, dropout_p=0.0, dropout_keep=None, sinks=None,
                  p_dtype=None):
    """softmax(q k^T * scale, masked) v for q (batch, seqlen_q, heads, dim) and k, v
    (batch, seqlen_k, heads_kv, dim). Causal: query row i sees key j iff j <= i + causal_offset
    (default seqlen_k - seqlen_q: bottom-right). window_size=(left, right), -1 unbounded:
    FlashAttention-2's sliding window, i + offset - left <= j <= i + offset + right (causal sets
    right to 0). softcap > 0: each scaled score s becomes softcap * tanh(s / softcap).
    alibi_slopes (heads,) or (batch, heads): adds -slope * |i + seqlen_k - seqlen_q - j|.
    score_bias: added to the scaled scores; visible: a boolean mask (both broadcastable to
    (batch, heads, seqlen_q, seqlen_k)), a config-defined variant's in Python. dropout_keep: the
    (batch, heads, seqlen_q, seqlen_k) boolean mask of kept probabilities (dropout_keep below),
    the kept ones scaled by 1 / (1 - dropout_p); lse is the undropped softmax's. sinks (heads,):
    a logit per head that joins each row's softmax (in lse too) and adds no value.
    p_dtype (torch.float8_e4m3fn): an 8-bit PV's route, the unnormalised probabilities
    exp(s - max) rounded to it before PV and the fp32 row sums divided out after (no sinks or
    dropout). upcast=True computes in fp32 (the reference);
    upcast=False keeps the matmuls in the input dtype, as a half-precision implementation
    would (PyTorch's own error). Returns out (input dtype) and lse (fp32, natural log;
    -inf and output 0 for rows that see no key)."""
    dtype = q.dtype
    seqlen_q, heads, dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(dim)
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    k = k.repeat_interleave(heads // heads_kv, dim=2)
    v = v.repeat_interleave(heads // heads_kv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).float() * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window_size
    if causal:
        right = 0
    offset = seqlen_k - seqlen_q if causal_offset is None else causal_offset
    row = torch.arange(seqlen_q, device=q.device).view(-1, 1)
    col = torch.arange(seqlen_k, device=q.device).view(1, -1)
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().expand(scores.shape[0], heads)[:, :, None, None]
        distance = (row + seqlen_k - seqlen_q - col).abs()
        scores = scores - slopes * distance
    if score_bias is not None:
        scores = scores + score_bias
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    if right >= 0:
        scores = scores.masked_fill(col > row + offset + right, -math.inf)
    if left >= 0:
        scores = scores.masked_fill(col < row + offset - left, -math.inf)
    if sinks is not None:  # a last column per row: the sink's logit, dropped after the softmax
        sink_column = sinks.float().view(1, heads, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if p_dtype is not None:
        unnormalised = torch.exp(scores - scores.amax(dim=-1, keepdim=True).clamp_min(-1e30))
        sums = unnormalised.sum(dim=-1, keepdim=True).clamp_min(1e-30)
        probs = unnormalised.to(p_dtype).float() / sums
    sees_no_key = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = probs.masked_fill(sees_no_key, 0.0)  # softmax gives NaN there; the output is 0
    if sinks is not None:
        probs = probs[..., :-1]
    if dropout_keep is not None:
        probs = probs * dropout_keep / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out.to(dtype), lse


_U32 = 0xFFFFFFFF


def philox4x32_10(counter: tuple, key0: int, key1: int) -> tuple:
    """templates/include/flashgen/common/philox.h in torch: four int64 tensors holding uint32
    counter words (or ints), a 64-bit key as two uint32 halves; returns the four output words.
    int64 products wrap as uint64 would, so their high and low halves are exact."""
    c0, c1, c2, c3 = counter
    for round_ in range(10):
        if round_:
            key0, key1 = (key0 + 0x9E3779B9) & _U32, (key1 + 0xBB67AE85) & _U32
        p0, p1 = c0 * 0xD2511F53, c2 * 0xCD9E8D57
        c0, c1, c2, c3 = (((p1 >> 32) & _U32) ^ c1 ^ key0, p1 & _U32,
                          ((p0 >> 32) & _U32) ^ c3 ^ key1, p0 & _U32)
    return c0, c1, c2, c3


def dropout_keep(seed: int, dropout_p: float, batch: int, heads: int, seqlen_q: int,
                 seqlen_k: int, device=None) -> torch.Tensor:
    """The kernels' dropout mask (common/dropout.cuh) for the Philox key `seed` (the int in the
    call's dropout_seed): (batch, heads, seqlen_q, seqlen_k) bool, True where the probability
    is kept. Element (i, j) reads the draw at counter (j with bits 0 and 3 cleared, i with bit 3
    cleared, batch, head): word 2 * (j // 8 % 2) + i // 8 % 2, its high half for odd j, else its
    low half; kept iff that is at least dropout_p (as the kernels' fp32) times 2^16, rounded."""
    seed &= (1 << 64) - 1
    key0, key1 = seed & _U32, seed >> 32
    p32 = torch.tensor(dropout_p, dtype=torch.float32).item()
    threshold = min(round(p32 * 65536.0), 65535)
    arange = functools.partial(torch.arange, device=device, dtype=torch.int64)
    b = arange(batch).view(-1, 1, 1, 1)
    h = arange(heads).view(1, -1, 1, 1)
    i = arange(seqlen_q).view(1, 1, -1, 1)
    j = arange(seqlen_k).view(1, 1, 1, -1)
    shape = (batch, heads, seqlen_q, seqlen_k)
    counter = tuple(t.expand(shape) for t in (j & ~9, i & ~8, b, h))
    words = torch.stack(philox4x32_10(counter, key0, key1), dim=-1)
    word = (2 * ((j >> 3) & 1) + ((i >> 3) & 1)).expand(shape)
    bits = words.gather(-1, word.unsqueeze(-1)).squeeze(-1)
    half = (bits >> (16 * (j & 1))) & 0xFFFF
    return half >= threshold


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max |actual - expected| over finite entries; the infinite ones must match exactly."""
    actual, expected = actual.float(), expected.float()
    inf = torch.isinf(expected)
    assert torch.equal(inf, torch.isinf(actual)), "infinities differ"
    assert torch.equal(actual[inf], expected[inf]), "infinities differ in sign"
    if (~inf).sum() == 0:
        return 0.0
    diff = (actual[~inf] - expected[~inf]).abs()
    assert not torch.isnan(diff).any(), "NaN in the output"
    return diff.max().item()


# eps of the rule for gradients. FlashAttention-2's backward takes D = rowsum(dout * out) where
# PyTorch's autograd sums dout * (probs @ v) itself: where a gradient is exactly zero (one key:
# the softmax is constant), PyTorch's error is exactly zero and eps alone is the budget, while the
# fp32 rounding of D summed over the queries is not: dk reached 1.8e-5 at 239 queries x 4 heads
# of a group (fp16, H100). 1e-4 is a floor, far below any real gradient error (1e-3 and up).
GRADIENT_EPS = 1e-4


def assert_close_fa2(actual, reference, same_dtype_reference, name="out", eps=1e-5):
    """FlashAttention-2's rule: error vs the fp32 reference at most twice PyTorch's own error in
    the same dtype, plus eps."""
    error = max_error(actual, reference)
    budget = 2 * max_error(same_dtype_reference, reference) + eps
    assert error <= budget, f"{name}: max error {error:.3e} > allowed {budget:.3e}"
