"""Config-defined variants (codegen/variants.py), the default config's examples end to end:
document masking, prefix-LM, per-head windows (a mask_mod that reads the head) and a
relative-position bias, each against the fp32 reference with the same mask or bias built in
Python, on every family, forward and gradients, with and without a prebuilt block mask, GQA,
varlen, deterministic gradients, dropout (document's table builds it), and bad input."""

from __future__ import annotations

import math

import pytest
import torch

import flashgen
from flashgen import (backward, flash_attn_func, flash_attn_varlen_func,
                      flash_attn_with_kvcache, forward)
from flashgen.dispatch import DispatchError
from flashgen.reference import assert_close_fa2, attention_ref
from tests.gpu.test_backward import (assert_attention_matches_reference, assert_grads_close,
                                     make_qkv)
from tests.gpu.test_dropout import mask_of_next_call
from tests.gpu.test_varlen import cu_seqlens

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

# (batch, seqlen, heads, heads_kv): odd lengths, GQA.
SHAPES = [(2, 700, 8, 2), (1, 1000, 4, 4)]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def document_ids(batch: int, seqlen: int, documents: int = 5) -> torch.Tensor:
    """(batch, seqlen) int32: each sequence cut into `documents` runs at random points."""
    ids = []
    for _ in range(batch):
        cuts = torch.randperm(seqlen - 1)[:documents - 1] + 1
        starts = torch.zeros(seqlen, dtype=torch.int32)
        starts[cuts] = 1
        ids.append(starts.cumsum(0, dtype=torch.int32))
    return torch.stack(ids).cuda()


def positions(seqlen: int):
    index = torch.arange(seqlen, device="cuda")
    return index.view(-1, 1), index.view(1, -1)  # query rows, key columns


def document_visible(doc_ids):
    q_idx, kv_idx = positions(doc_ids.shape[1])
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return ((kv_idx <= q_idx) & same)[:, None]  # (batch, 1, seqlen, seqlen)


def prefix_lm_visible(prefix_len, seqlen: int):
    q_idx, kv_idx = positions(seqlen)
    return ((kv_idx <= q_idx) | (kv_idx < prefix_len.view(-1, 1, 1)))[:, None]


def head_window_mask(window, q_idx, kv_idx):
    """(heads, len(q_idx), len(kv_idx)): what each head's query positions see."""
    q_idx, kv_idx, window = q_idx.view(1, -1, 1), kv_idx.view(1, 1, -1), window.view(-1, 1, 1)
    return (kv_idx <= q_idx) & ((window < 0) | (q_idx - kv_idx < window))


def head_window_visible(window, seqlen: int):
    index = torch.arange(seqlen, device="cuda")
    return head_window_mask(window, index, index)[None]


def relative_bias_scores(bias, seqlen: int):
    q_idx, kv_idx = positions(seqlen)
    return bias[:, kv_idx - q_idx + (bias.shape[1] - 1) // 2][None]  # (1, heads, sq, sk)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_s{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("prebuilt", [False, True], ids=["per_call", "block_mask"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_document_mask(dtype, head_dim, prebuilt, shape, each_family):
    batch, seqlen, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, DTYPES[dtype], False)
    doc_ids = document_ids(batch, seqlen)
    tensors = {"doc_ids": doc_ids}
    block_mask = flashgen.block_mask("document", q, k, tensors) if prebuilt else None
    reference = dict(causal=False, visible=document_visible(doc_ids))
    assert_attention_matches_reference(q, k, v, reference, variant="document",
                                       variant_tensors=tensors, block_mask=block_mask)
    assert forward.kernel_for(q.device, dtype, head_dim, "document", batch * heads,
                              seqlen).mask == "document"


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_prefix_lm(dtype, head_dim, each_family):
    batch, seqlen, heads = 3, 517, 4
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads, head_dim, DTYPES[dtype], False)
    prefix_len = torch.tensor([0, 100, 517], dtype=torch.int32, device="cuda")
    reference = dict(causal=False, visible=prefix_lm_visible(prefix_len, seqlen))
    assert_attention_matches_reference(q, k, v, reference, variant="prefix_lm",
                                       variant_tensors={"prefix_len": prefix_len})


# Per query head (8 heads over 2 KV heads, so each backward key block walks heads of different
# windows): the whole causal prefix, windows under, across and over a tile, and none at all.
HEAD_WINDOWS = [-1, 1, 0, 100, 300, 129, -1, 64]


@pytest.mark.parametrize("prebuilt", [False, True], ids=["per_call", "block_mask"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_per_head_windows(dtype, head_dim, prebuilt, each_family):
    """head_window's mask_mod reads h, so its block mask holds one per query head and each head
    walks only its own key blocks; a head whose window is 0 sees nothing (output 0, lse -inf,
    gradients 0)."""
    batch, seqlen, heads, heads_kv = 2, 777, 8, 2
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, DTYPES[dtype], False)
    window = torch.tensor(HEAD_WINDOWS, dtype=torch.int32, device="cuda")
    tensors = {"window": window}
    block_mask = flashgen.block_mask("head_window", q, k, tensors) if prebuilt else None
    if prebuilt:
        assert block_mask.ranges.shape[:2] == (batch, heads)
    reference = dict(causal=False, visible=head_window_visible(window, seqlen))
    assert_attention_matches_reference(q, k, v, reference, variant="head_window",
                                       variant_tensors=tensors, block_mask=block_mask)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_relative_bias(dtype, head_dim, causal, each_family):
    batch, seqlen, heads, heads_kv = 2, 600, 8, 2
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, DTYPES[dtype], False)
    bias = torch.randn(heads, 2 * seqlen - 1, device="cuda")
    reference = dict(causal=causal, score_bias=relative_bias_scores(bias, seqlen))
    assert_attention_matches_reference(q, k, v, reference, causal=causal,
                                       variant="relative_bias", variant_tensors={"bias": bias})
    assert backward.kernel_for(q.device, dtype, head_dim, "causal" if causal else "none",
                               score_mod="relative_bias").score_mod == "relative_bias"


@pytest.mark.parametrize("variant", ["document", "head_window"])
def test_varlen_variants_see_positions_within_their_sequence(variant):
    lengths, heads, head_dim = [300, 57, 512], 8, 128
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    cu = cu_seqlens(lengths)
    if variant == "document":
        doc_ids = document_ids(len(lengths), max(lengths))
        tensors = {"doc_ids": doc_ids}
        visible = [document_visible(doc_ids[b:b + 1, :n]) for b, n in enumerate(lengths)]
    else:
        window = torch.tensor(HEAD_WINDOWS, dtype=torch.int32, device="cuda")
        tensors = {"window": window}
        visible = [head_window_visible(window, n) for n in lengths]
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                 variant=variant, variant_tensors=tensors)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    starts = cu.tolist()
    for b, length in enumerate(lengths):
        rows = slice(starts[b], starts[b + 1])
        seq = [t[rows].unsqueeze(0).detach().requires_grad_() for t in (q, k, v)]
        kwargs = dict(causal=False, visible=visible[b])
        ref, _ = attention_ref(*seq, **kwargs)
        same_dtype, _ = attention_ref(*seq, upcast=False, **kwargs)
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
        assert_grads_close(tuple(g[rows].unsqueeze(0) for g in grads), *seq,
                           dout[rows].unsqueeze(0), **kwargs)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_document_mask_with_dropout(dtype, head_dim, each_family):
    """Dropout's mask over the variant's: forward, lse and gradients against the reference under
    the same keep mask; the backward regenerates the mask, deterministic runs are bit-identical,
    and a new key drops other probabilities."""
    batch, seqlen, heads, heads_kv = SHAPES[0]
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, DTYPES[dtype], False)
    tensors = {"doc_ids": document_ids(batch, seqlen)}
    p = 0.17
    keep = mask_of_next_call(23, p, batch, heads, seqlen, seqlen)
    reference = dict(causal=False, visible=document_visible(tensors["doc_ids"]), dropout_p=p,
                     dropout_keep=keep)
    assert_attention_matches_reference(q, k, v, reference, variant="document",
                                       variant_tensors=tensors, dropout_p=p)
    dout = torch.randn_like(q)

    def run(seed):
        torch.manual_seed(seed)
        out = flash_attn_func(q, k, v, dropout_p=p, variant="document", variant_tensors=tensors,
                              deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    first = run(5)
    assert all(torch.equal(a, b) for a, b in zip(first, run(5)))
    assert not torch.equal(first[0], run(6)[0])
    assert forward.kernel_for(q.device, dtype, head_dim, "document", batch * heads, seqlen,
                              dropout=True).dropout


def test_a_variant_built_without_dropout_says_how_to_build_it():
    q, k, v = make_qkv(2, 64, 64, 4, 4, 64, torch.bfloat16, False)
    prefix_len = torch.tensor([10, 20], dtype=torch.int32, device="cuda")
    with pytest.raises(DispatchError, match=r"dropout = true in its \[variants.prefix_lm\]"):
        flash_attn_func(q, k, v, dropout_p=0.1, variant="prefix_lm",
                        variant_tensors={"prefix_len": prefix_len})


@pytest.mark.parametrize("variant", ["document", "head_window"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_gradients_are_bit_identical(head_dim, variant, each_family):
    """The hopper backward adds dQ in an order its block ranges fix: a variant's must agree
    between the two views (key blocks per query block and back), per head where they are per
    head, or a run would hang."""
    q, k, v = make_qkv(2, 1100, 1100, 8, 2, head_dim, torch.bfloat16, False)
    dout = torch.randn_like(q)
    tensors = ({"doc_ids": document_ids(2, 1100, documents=7)} if variant == "document" else
               {"window": torch.tensor(HEAD_WINDOWS, dtype=torch.int32, device="cuda")})

    def grads():
        out = flash_attn_func(q, k, v, variant=variant, variant_tensors=tensors,
                              deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads()
    assert all(torch.equal(a, b) for a, b in zip(first, grads()))


def test_bad_variant_arguments_name_what_is_wrong():
    q, k, v = make_qkv(2, 64, 64, 4, 4, 64, torch.bfloat16, False)
    ids = document_ids(2, 64)
    with pytest.raises(ValueError, match="variant='nope' is not defined .* document"):
        flash_attn_func(q, k, v, variant="nope")
    with pytest.raises(ValueError, match=r"reads tensor\(s\) \['doc_ids'\]"):
        flash_attn_func(q, k, v, variant="document")
    with pytest.raises(ValueError, match=r"reads no tensor\(s\) \['extra'\]"):
        flash_attn_func(q, k, v, variant="document", variant_tensors={"doc_ids": ids,
                                                                      "extra": ids})
    with pytest.raises(TypeError, match="'doc_ids' must be torch.int32"):
        flash_attn_func(q, k, v, variant="document", variant_tensors={"doc_ids": ids.long()})
    with pytest.raises(ValueError, match=r"must have shape \[batch, seqlen_k\] = \(2, 64\)"):
        flash_attn_func(q, k, v, variant="document", variant_tensors={"doc_ids": ids[:, :10]})
    with pytest.raises(ValueError, match="own mask_mod; pass causal=False"):
        flash_attn_func(q, k, v, causal=True, variant="document",
                        variant_tensors={"doc_ids": ids})
    with pytest.raises(ValueError, match="block_mask was built for"):
        other = flashgen.block_mask("document", q[:1], k[:1], {"doc_ids": ids[:1]})
        flash_attn_func(q, k, v, variant="document", variant_tensors={"doc_ids": ids},
                        block_mask=other)
    bias = torch.zeros(4, 127, device="cuda", requires_grad=True)
    with pytest.raises(ValueError, match="requires grad"):
        flash_attn_func(q, k, v, variant="relative_bias", variant_tensors={"bias": bias})
    with pytest.raises(ValueError, match=r"'bias' has 0 elements; .* 1 to 2\^31 - 1 elements"):
        flash_attn_func(q, k, v, variant="relative_bias",
                        variant_tensors={"bias": bias.detach()[:, :0]})
    with pytest.raises(NotImplementedError, match="own score_mod"):
        flash_attn_func(q, k, v, softcap=5.0, variant="relative_bias",
                        variant_tensors={"bias": bias.detach()})
    with pytest.raises(ValueError, match="go with variant="):
        flash_attn_func(q, k, v, variant_tensors={"doc_ids": ids})


def decode_reference(q, cache, lengths, causal, visible=None, score_bias=None):
    """fp32 and same-dtype references of flash_attn_with_kvcache per sequence: new token i of a
    sequence of L keys sits at q_idx = L - seqlen_q + i. visible(b, q_idx, kv_idx) -> (1 or
    heads, sq, L) bool, score_bias(q_idx, kv_idx) -> (heads, sq, L) fp32."""
    k_all, v_all = cache.logical(cache.k), cache.logical(cache.v)
    refs, lses, same = [], [], []
    for b, length in enumerate(lengths):
        q_idx = torch.arange(q.shape[1], device="cuda") + length - q.shape[1]
        kv_idx = torch.arange(length, device="cuda")
        kwargs = dict(causal=causal)
        if visible is not None:
            kwargs["visible"] = (visible(b, q_idx, kv_idx) & (q_idx >= 0)[:, None])[None]
        if score_bias is not None:
            kwargs["score_bias"] = score_bias(q_idx, kv_idx)[None]
        args = (q[b:b + 1], k_all[b:b + 1, :length], v_all[b:b + 1, :length])
        out, lse = attention_ref(*args, **kwargs)
        refs.append(out)
        lses.append(lse)
        same.append(attention_ref(*args, upcast=False, **kwargs)[0])
    return torch.cat(refs), torch.cat(lses), torch.cat(same)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_score_mod_never_reads_past_the_sequence(head_dim, each_family):
    """relative_bias's table holds exactly the distances of 600 x 600 positions, between rows of
    NaN (its storage's first and last): a tile's padding rows and keys (600 is no multiple of a
    tile) would index past it, and a NaN read there reaches dV through P of the padding rows."""
    batch, seqlen, heads, heads_kv = 2, 600, 8, 2
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, torch.bfloat16, False)
    storage = torch.full((heads + 2, 2 * seqlen - 1), math.nan, device="cuda")
    storage[1:-1] = torch.randn(heads, 2 * seqlen - 1, device="cuda")
    bias = storage[1:-1]  # contiguous: the kernels read it in place
    assert bias.is_contiguous()
    reference = dict(causal=False, score_bias=relative_bias_scores(bias, seqlen))
    assert_attention_matches_reference(q, k, v, reference, variant="relative_bias",
                                       variant_tensors={"bias": bias})


@pytest.mark.parametrize("seqlen_q", [1, 3])
@pytest.mark.parametrize("num_splits", [0, 3], ids=["splits_chosen", "splits3"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_runs_a_variant_over_the_cache(head_dim, page_size, num_splits, seqlen_q):
    """flash_attn_with_kvcache with document's and head_window's masks (per head: a tile's rows
    are the query heads of a KV head) and relative_bias's score modifier (their tables set
    kvcache = true): a new token's q_idx is its position in its sequence; sequences shorter than
    the new tokens (0 and 1 keys) leave the early tokens seeing nothing."""
    from tests.gpu.test_kvcache import Cache, lengths_for

    batch, capacity, heads, heads_kv = 5, 384, 8, 2
    lengths = lengths_for(batch, capacity, 0)
    cache = Cache(batch, capacity, heads_kv, head_dim, torch.bfloat16, lengths, page_size)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    doc_ids = document_ids(batch, capacity, documents=6)
    window = torch.tensor(HEAD_WINDOWS, dtype=torch.int32, device="cuda")
    bias = torch.randn(heads, 2 * capacity - 1, device="cuda")
    center = (bias.shape[1] - 1) // 2
    cases = [
        ("document", {"doc_ids": doc_ids}, False,
         dict(visible=lambda b, qi, ki: ((ki[None, :] <= qi[:, None])
              & (doc_ids[b, qi.clamp(min=0)][:, None] == doc_ids[b, ki][None, :]))[None])),
        ("head_window", {"window": window}, False,
         dict(visible=lambda b, qi, ki: head_window_mask(window, qi, ki))),
        ("relative_bias", {"bias": bias}, True,
         dict(score_bias=lambda qi, ki: bias[:, (ki[None, :] - qi[:, None] + center)
                                             .clamp(0, bias.shape[1] - 1)])),
    ]
    for variant, tensors, causal, reference in cases:
        out, lse = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                           block_table=cache.block_table, causal=causal,
                                           num_splits=num_splits, return_softmax_lse=True,
                                           variant=variant, variant_tensors=tensors)
        ref, ref_lse, same_dtype = decode_reference(q, cache, lengths, causal, **reference)
        assert_close_fa2(out, ref, same_dtype, f"{variant} out")
        assert_close_fa2(lse, ref_lse, ref_lse, f"{variant} lse", eps=1e-4)


def test_decode_variant_bad_input_names_what_is_wrong():
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16)
    ids = document_ids(2, 128)
    with pytest.raises(DispatchError, match=r"'prefix_lm' has no KV-cache kernels: set kvcache"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), variant="prefix_lm",
                                variant_tensors={"prefix_len": ids[:, 0].contiguous()})
    with pytest.raises(ValueError, match="own mask_mod; pass causal=False"):
        flash_attn_with_kvcache(torch.randn_like(q.expand(2, 3, 4, 64)), k_cache,
                                k_cache.clone(), causal=True,
                                variant="document", variant_tensors={"doc_ids": ids})
    with pytest.raises(ValueError, match=r"must have shape \[batch, seqlen_k\] = \(2, 128\)"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), variant="document",
                                variant_tensors={"doc_ids": ids[:, :64]})
    with pytest.raises(NotImplementedError, match="own score_mod"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), softcap=5.0,
                                variant="relative_bias",
                                variant_tensors={"bias": torch.zeros(4, 255, device="cuda")})
    with pytest.raises(ValueError, match="go with variant="):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), variant_tensors={"doc_ids": ids})
