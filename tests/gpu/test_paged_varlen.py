"""flash_attn_varlen_func over a paged KV cache, the call serving engines make (vLLM's
FlashAttention backend): queries packed by cu_seqlens_q, prefill and decode rows in one batch,
keys in pages of any size through a block table, each sequence's length from seqused_k or
cu_seqlens_k; out=, return_softmax_lse, sinks, under CUDA graphs with new lengths and tables."""

from __future__ import annotations

import pytest
import torch

from flashgen import flash_attn_varlen_func, flash_attn_with_kvcache
from flashgen.reference import assert_close_fa2, attention_ref
from tests.gpu.test_kvcache import Cache

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

# (query rows, keys) per sequence: decode rows, a chunk of prefill, an empty query, a whole
# prompt, one key.
MIXED = [(1, 700), (37, 300), (0, 64), (1, 1), (300, 300), (4, 1000)]
CAPACITY = 1024


def packed_queries(rows, heads, head_dim, dtype):
    q = torch.randn(sum(rows), heads, head_dim, device="cuda").to(dtype)
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    return q, torch.tensor(starts, dtype=torch.int32, device="cuda")


def per_sequence_reference(q, cu_seqlens_q, cache, lengths, **kwargs):
    """(fp32 out, lse (heads, total), same-dtype out) sequence by sequence."""
    starts = cu_seqlens_q.tolist()
    k, v = cache.logical(cache.k), cache.logical(cache.v)
    outs, lses, same = [], [], []
    for b, length in enumerate(lengths):
        rows = slice(starts[b], starts[b + 1])
        qb = q[rows].unsqueeze(0)
        alibi = kwargs.get("alibi_slopes")
        call = {**kwargs, "alibi_slopes": None if alibi is None else alibi[b]}
        ref, lse = attention_ref(qb, k[b:b + 1, :length], v[b:b + 1, :length], **call)
        pt, _ = attention_ref(qb, k[b:b + 1, :length], v[b:b + 1, :length], upcast=False, **call)
        outs.append(ref[0])
        lses.append(lse[0])
        same.append(pt[0])
    return torch.cat(outs), torch.cat(lses, dim=-1), torch.cat(same)


def lengths_of(pairs):
    return [n for _, n in pairs]


@pytest.mark.parametrize("page_size", [1, 16, 64, 256], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (True, (128, 0))], ids=["full", "causal", "window"])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_mixed_prefill_and_decode_rows_match_the_reference(dtype, head_dim, heads, causal,
                                                           window, page_size):
    heads_q, heads_kv = heads
    lengths = lengths_of(MIXED)
    cache = Cache(len(MIXED), CAPACITY, heads_kv, head_dim, dtype, lengths, page_size)
    q, cu_seqlens_q = packed_queries([n for n, _ in MIXED], heads_q, head_dim, dtype)
    seqused_k = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_varlen_func(
        q, cache.k, cache.v, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=300, seqused_k=seqused_k,
        max_seqlen_k=CAPACITY, causal=causal, window_size=window, block_table=cache.block_table,
        return_softmax_lse=True)
    ref, ref_lse, same_dtype = per_sequence_reference(q, cu_seqlens_q, cache, lengths,
                                                      causal=causal, window_size=window)
    assert out.shape == q.shape and lse.shape == (heads_q, q.shape[0])
    assert_close_fa2(out, ref, same_dtype)
    assert_close_fa2(lse, ref_lse, ref_lse, name="lse", eps=1e-4)


@pytest.mark.parametrize("modifier", ["softcap", "alibi", "softcap_alibi", "sinks"])
def test_score_modifiers_and_sinks_over_pages(modifier):
    dtype, head_dim, heads_q, heads_kv, page_size = torch.bfloat16, 128, 8, 2, 16
    lengths = lengths_of(MIXED)
    cache = Cache(len(MIXED), CAPACITY, heads_kv, head_dim, dtype, lengths, page_size)
    q, cu_seqlens_q = packed_queries([n for n, _ in MIXED], heads_q, head_dim, dtype)
    q = q * 3  # scores the cap bends
    kwargs = {}
    if "softcap" in modifier:
        kwargs["softcap"] = 20.0
    if "alibi" in modifier:
        kwargs["alibi_slopes"] = torch.rand(len(MIXED), heads_q, device="cuda") * 0.3
    extra = {}
    if modifier == "sinks":
        extra["s_aux"] = torch.randn(heads_q, device="cuda") * 2
    seqused_k = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, cache.k, cache.v, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=300,
                                 seqused_k=seqused_k, max_seqlen_k=CAPACITY, causal=True,
                                 block_table=cache.block_table, **kwargs, **extra)
    ref, _, same_dtype = per_sequence_reference(q, cu_seqlens_q, cache, lengths, causal=True,
                                                sinks=extra.get("s_aux"), **kwargs)
    assert_close_fa2(out, ref, same_dtype)


def test_cu_seqlens_k_gives_the_lengths_as_seqused_k_does():
    """FlashAttention-2's call: the keys' lengths as cu_seqlens_k's runs."""
    dtype, heads_kv = torch.bfloat16, 2
    lengths = lengths_of(MIXED)
    cache = Cache(len(MIXED), CAPACITY, heads_kv, 64, dtype, lengths, 256)
    q, cu_seqlens_q = packed_queries([n for n, _ in MIXED], 8, 64, dtype)
    cu_seqlens_k = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(),
                                dtype=torch.int32, device="cuda")
    by_runs = flash_attn_varlen_func(q, cache.k, cache.v, cu_seqlens_q, cu_seqlens_k, 300,
                                     max(lengths), causal=True, block_table=cache.block_table)
    by_used = flash_attn_varlen_func(
        q, cache.k, cache.v, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=300, max_seqlen_k=CAPACITY,
        seqused_k=torch.tensor(lengths, dtype=torch.int32, device="cuda"), causal=True,
        block_table=cache.block_table)
    assert torch.equal(by_runs, by_used)


def test_decode_rows_match_flash_attn_with_kvcache_on_the_same_cache():
    dtype, batch = torch.bfloat16, 16
    lengths = torch.randint(1, 4096, (batch,)).tolist()
    cache = Cache(batch, 4096, 2, 128, dtype, lengths, 16)
    q = torch.randn(batch, 1, 16, 128, device="cuda").to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    expected = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                       block_table=cache.block_table)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q.squeeze(1), cache.k, cache.v, cu_seqlens_q=cu_seqlens_q,
                                 max_seqlen_q=1, seqused_k=seqlens, max_seqlen_k=4096,
                                 block_table=cache.block_table)
    ref, _, same_dtype = per_sequence_reference(q.squeeze(1), cu_seqlens_q, cache, lengths)
    assert_close_fa2(out, ref, same_dtype)
    assert_close_fa2(expected.squeeze(1), ref, same_dtype, name="flash_attn_with_kvcache")


def test_out_is_written_in_place_aligned_or_not():
    dtype = torch.float16
    lengths = lengths_of(MIXED)
    cache = Cache(len(MIXED), CAPACITY, 2, 64, dtype, lengths, 64)
    q, cu_seqlens_q = packed_queries([n for n, _ in MIXED], 8, 64, dtype)
    seqused_k = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    call = dict(cu_seqlens_q=cu_seqlens_q, max_seqlen_q=300, seqused_k=seqused_k,
                max_seqlen_k=CAPACITY, causal=True, block_table=cache.block_table)
    expected = flash_attn_varlen_func(q, cache.k, cache.v, **call)
    aligned = torch.empty_like(q)
    wide = torch.empty(q.shape[0], q.shape[1], 72, dtype=dtype, device="cuda")
    for buffer in (aligned, wide[..., 3:67]):  # the second: rows at 2-byte offsets
        result = flash_attn_varlen_func(q, cache.k, cache.v, out=buffer, **call)
        assert result.data_ptr() == buffer.data_ptr()
        assert torch.equal(buffer, expected)


def test_a_mixed_batch_replays_in_a_cuda_graph_with_new_lengths_and_tables():
    dtype, heads_kv, page = torch.bfloat16, 2, 16
    lengths = lengths_of(MIXED)
    cache = Cache(len(MIXED), CAPACITY, heads_kv, 128, dtype, lengths, page)
    for t in (cache.k, cache.v):  # every page holds keys: the replays reorder them
        t.copy_(torch.where(t.isnan(), torch.randn_like(t), t))
    q, cu_seqlens_q = packed_queries([n for n, _ in MIXED], 8, 128, dtype)
    seqused_k = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    table = cache.block_table.clone()
    out = torch.empty_like(q)

    def step():
        flash_attn_varlen_func(q, cache.k, cache.v, out=out, cu_seqlens_q=cu_seqlens_q,
                               max_seqlen_q=300, seqused_k=seqused_k, max_seqlen_k=CAPACITY,
                               causal=True, block_table=table, s_aux=sinks)

    sinks = torch.randn(8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm-up: loads the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for new_lengths in ([900, 301, 64, 2, 300, 4], [3, 40, 1000, 1, 1024, 512]):
        seqused_k.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        table.copy_(table.flip(1))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        cache.block_table = table
        ref, _, same_dtype = per_sequence_reference(q, cu_seqlens_q, cache, new_lengths,
                                                    causal=True, sinks=sinks)
        assert_close_fa2(out, ref, same_dtype)


def _call(**change):
    dtype = torch.float16
    cache = Cache(2, 64, 2, 64, dtype, [10, 64], 16)
    q, cu_seqlens_q = packed_queries([3, 1], 4, 64, dtype)
    call = dict(q=q, k=cache.k, v=cache.v, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=3,
                seqused_k=torch.tensor([10, 64], dtype=torch.int32, device="cuda"),
                max_seqlen_k=64, block_table=cache.block_table)
    call.update({name: value(call) if callable(value) else value
                 for name, value in change.items()})
    return flash_attn_varlen_func(**call)


@pytest.mark.parametrize("change, error, message", [
    (dict(block_table=lambda c: c["block_table"].long()), TypeError, "block_table must be int32"),
    (dict(block_table=lambda c: c["block_table"][:1]), ValueError, "block_table must be"),
    (dict(block_table=lambda c: c["block_table"].cpu()), ValueError, "block_table is on"),
    (dict(seqused_k=lambda c: c["seqused_k"][:1]), ValueError, "seqused_k must have shape"),
    (dict(seqused_k=None), ValueError, "pass seqused_k"),
    (dict(out=lambda c: torch.empty(4, 4, 32, dtype=torch.float16, device="cuda")), ValueError,
     "out must have shape"),
    (dict(out=lambda c: torch.empty_like(c["q"], dtype=torch.bfloat16)), TypeError,
     "out must be torch.float16"),
    (dict(s_aux=lambda c: torch.zeros(3, device="cuda")), ValueError, "s_aux .* shape"),
    (dict(s_aux=lambda c: torch.zeros(4, device="cuda", dtype=torch.float16)), TypeError,
     "s_aux .* float32"),
    (dict(dropout_p=0.1), ValueError, "dropout_p=0"),
    (dict(k=lambda c: c["k"][0]), ValueError, "k_cache must be"),
], ids=["table_dtype", "table_shape", "table_device", "seqused_shape", "no_lengths",
        "out_shape", "out_dtype", "sinks_shape", "sinks_dtype", "dropout", "cache_rank"])
def test_bad_input_names_the_argument(change, error, message):
    with pytest.raises(error, match=message):
        _call(**change)


def test_debug_checks_find_lengths_past_the_pages(monkeypatch):
    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")
    with pytest.raises(ValueError, match="seqused_k spans .*block_table holds"):
        _call(seqused_k=lambda c: torch.tensor([10, 65], dtype=torch.int32, device="cuda"))
