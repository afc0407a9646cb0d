"""flash_attn_with_kvcache: attention over a contiguous or paged KV cache, appends with rotary
embeddings, split-KV decoding, CUDA graphs and bad input, against an fp32 reference."""

import math
import os

import pytest
import torch

from flashgen import flash_attn_with_kvcache
from flashgen.reference import assert_close_fa2, attention_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [64, 128]  # the default config's decode kernels
PAGE_SIZES = [None, 1, 16, 48, 256]  # None: a contiguous cache
GQA = [(8, 8), (8, 2), (16, 2)]  # (heads, heads_kv): group sizes 1, 4 and 8


class Cache:
    """A KV cache and its logical view (batch, capacity, heads_kv, dim): contiguous, or paged in
    pages of page_size keys through a shuffled block table. Every position past a sequence's
    length, and every page no sequence owns, holds NaN: a kernel that reads one shows it."""

    def __init__(self, batch, capacity, heads_kv, head_dim, dtype, lengths, page_size=None):
        self.page_size = page_size
        self.lengths = lengths
        logical = [torch.randn(batch, capacity, heads_kv, head_dim, device="cuda").to(dtype)
                   for _ in range(2)]
        for t in logical:
            for b, length in enumerate(lengths):
                t[b, length:] = math.nan
        if page_size is None:
            self.k, self.v = logical
            self.block_table = None
            return
        assert capacity % page_size == 0
        per_seq = capacity // page_size
        pages = batch * per_seq + 3  # three pages nobody owns
        order = torch.randperm(pages, device="cuda")[:batch * per_seq]
        self.block_table = order.view(batch, per_seq).to(torch.int32)
        self.k, self.v = (torch.full((pages, page_size, heads_kv, head_dim), math.nan,
                                     device="cuda", dtype=dtype) for _ in range(2))
        for paged, t in zip((self.k, self.v), logical):
            paged[order] = t.reshape(batch * per_seq, page_size, heads_kv, head_dim)

    def logical(self, t):
        """The (batch, capacity, heads_kv, dim) view of k or v (a copy when paged)."""
        if self.block_table is None:
            return t
        return t[self.block_table.long()].flatten(1, 2)


def rotate(x, cos, sin, positions, interleaved):
    """x (batch, seq, heads, dim) rotated in fp32 at positions (batch, seq): FlashAttention's
    apply_rotary_emb."""
    half = cos.shape[1]
    c = cos.float()[positions][:, :, None, :]
    s = sin.float()[positions][:, :, None, :]
    x = x.float()
    rot = x[..., :2 * half]
    if interleaved:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)
    else:
        x0, x1 = rot[..., :half], rot[..., half:]
        out = torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)
    return torch.cat([out, x[..., 2 * half:]], dim=-1)


def reference(q, k_logical, v_logical, lengths, causal, **kwargs):
    """(fp32 reference out, lse) and PyTorch's same-dtype out, per sequence of its own length
    (kwargs: more of attention_ref's arguments)."""
    outs = {True: [], False: []}
    lses = []
    for b, length in enumerate(lengths):
        for upcast in (True, False):
            o, lse = attention_ref(q[b:b + 1], k_logical[b:b + 1, :length],
                                   v_logical[b:b + 1, :length], causal=causal, upcast=upcast,
                                   **kwargs)
            outs[upcast].append(o)
            if upcast:
                lses.append(lse)
    return torch.cat(outs[True]), torch.cat(lses), torch.cat(outs[False])


def check_attention(q, cache, lengths, causal, **kwargs):
    """flash_attn_with_kvcache over the cache's first `lengths` keys (kwargs: more of its
    arguments) against the fp32 reference: out and lse."""
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                       block_table=cache.block_table, causal=causal,
                                       return_softmax_lse=True, **kwargs)
    ref, ref_lse, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v),
                                         lengths, causal)
    assert_close_fa2(out, ref, same_dtype)
    assert_close_fa2(lse, ref_lse, ref_lse, name="lse", eps=1e-4)


def lengths_for(batch, capacity, new):
    """Empty, one key, odd, and full to capacity (after the new keys), then random."""
    fixed = [0, 1, 37, capacity - new]
    extra = torch.randint(0, capacity - new + 1, (max(0, batch - 4),)).tolist()
    return [min(length, capacity - new) for length in fixed + extra][:batch]


@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=lambda p: f"page{p}" if p else "dense")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("heads", GQA, ids=lambda h: f"h{h[0]}_hk{h[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_attention_over_the_cache(dtype, head_dim, heads, seqlen_q, causal, page_size,
                                  poisoned_allocations):
    batch, capacity = 5, 768
    heads_q, heads_kv = heads
    lengths = lengths_for(batch, capacity, 0)
    lengths[1] = max(lengths[1], seqlen_q)  # causal rows of a 1-key cache see nothing otherwise
    cache = Cache(batch, capacity, heads_kv, head_dim, dtype, lengths, page_size)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda").to(dtype)
    check_attention(q, cache, lengths, causal=causal)


@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_chunked_prefill_runs_a_forward_sized_tile(dtype, head_dim, causal, page_size,
                                                   poisoned_allocations):
    """100 new tokens x 4 query heads per KV head: 400 rows per KV head, past PREFILL_ROWS."""
    from flashgen import decode

    batch, capacity, new = 2, 640, 100
    lengths = [capacity - 3, 250]
    cache = Cache(batch, capacity, 2, head_dim, dtype, lengths, page_size)
    q = torch.randn(batch, new, 8, head_dim, device="cuda").to(dtype)
    assert decode.kernel_for(q.device, "fp16" if dtype == torch.float16 else "bf16", head_dim,
                             causal, new, group=4).tile.block_m == 128
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                  block_table=cache.block_table, causal=causal)
    ref, _, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v), lengths,
                                   causal)
    assert_close_fa2(out, ref, same_dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 64, 200])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
def test_any_split_gives_the_same_result(num_splits, page_size, poisoned_allocations):
    """More splits than key blocks leave some empty: they must weigh nothing."""
    batch, capacity, dtype = 3, 4096, torch.bfloat16
    lengths = [4096, 1000, 3]
    cache = Cache(batch, capacity, 2, 128, dtype, lengths, page_size)
    q = torch.randn(batch, 1, 8, 128, device="cuda").to(dtype)
    check_attention(q, cache, lengths, causal=False, num_splits=num_splits)


@pytest.mark.parametrize("rotary", [None, "interleaved", "halves", "partial"])
@pytest.mark.parametrize("page_size", [None, 16, 48], ids=lambda p: f"page{p}" if p else "dense")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("new", [1, 3])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_append_writes_the_new_keys_and_attends_to_them(dtype, head_dim, new, causal, page_size,
                                                        rotary, poisoned_allocations):
    check_append(dtype, head_dim, new, causal, page_size, rotary, capacity=480)


@pytest.mark.parametrize("rotary", [None, "halves"])
@pytest.mark.parametrize("page_size", [None, 64, 128, 256],
                         ids=lambda p: f"page{p}" if p else "dense")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_chunked_prefill_attends_on_a_forward_that_reads_the_cache(
        dtype, head_dim, causal, page_size, rotary, poisoned_allocations, monkeypatch):
    """260 new tokens (FORWARD_PREFILL_TOKENS or more): on sm_90 the decode kernel appends and
    the hopper forward attends over the cache, reading pages of whole key blocks (128 keys at
    these head dims; page 64 runs on the decode kernel), partial last blocks past NaN slots."""
    from flashgen import decode, forward

    assert 260 >= decode.FORWARD_PREFILL_TOKENS
    specs, run = [], forward.run
    monkeypatch.setattr(forward, "run", lambda launcher, *args, **kwargs: (
        specs.append(launcher.spec), run(launcher, *args, **kwargs))[1])
    check_append(dtype, head_dim, 260, causal, page_size, rotary, capacity=768)
    on_forward = (torch.cuda.get_device_capability() == (9, 0) and page_size != 64
                  and os.environ.get("FLASHGEN_FAMILY", "hopper") == "hopper")
    assert [s.family for s in specs] == (["hopper"] if on_forward else [])


def check_append(dtype, head_dim, new, causal, page_size, rotary, capacity):
    """Appends `new` keys (rotated as `rotary` says) to caches of lengths 0, 1, odd and full:
    the cache holds them exactly there and is unchanged elsewhere, and the output attends to
    them."""
    batch, heads_q, heads_kv = 4, 8, 2
    lengths = lengths_for(batch, capacity, new)
    cache = Cache(batch, capacity, heads_kv, head_dim, dtype, lengths, page_size)
    before = [cache.logical(t).clone() for t in (cache.k, cache.v)]
    q = torch.randn(batch, new, heads_q, head_dim, device="cuda").to(dtype)
    k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim, device="cuda").to(dtype)
                    for _ in range(2))
    rotary_dim = {None: 0, "interleaved": head_dim, "halves": head_dim,
                  "partial": head_dim // 2}[rotary]
    interleaved = rotary != "halves"
    cos = sin = None
    if rotary:
        angles = torch.rand(capacity, rotary_dim // 2, device="cuda") * 2 * math.pi
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, cache.k, cache.v, k_new, v_new, rotary_cos=cos,
                                  rotary_sin=sin, cache_seqlens=seqlens,
                                  block_table=cache.block_table, causal=causal,
                                  rotary_interleaved=interleaved)

    positions = torch.tensor(lengths, device="cuda")[:, None] + torch.arange(new, device="cuda")
    k_expected, q_rot = k_new, q
    if rotary:
        k_expected = rotate(k_new, cos, sin, positions, interleaved).to(dtype)
        q_positions = positions if causal else positions[:, :1].expand(-1, new)
        q_rot = rotate(q, cos, sin, q_positions, interleaved).to(dtype)
    after = [cache.logical(t) for t in (cache.k, cache.v)]
    for name, old, now, written in (("k_cache", before[0], after[0], k_expected),
                                    ("v_cache", before[1], after[1], v_new)):
        for b, length in enumerate(lengths):
            # rotated in fp32 and rounded once, as the reference: equal up to the rounding of
            # an fma
            torch.testing.assert_close(now[b, length:length + new], written[b],
                                       rtol=torch.finfo(dtype).eps, atol=1e-6,
                                       msg=f"{name} row {b}: the new keys")
            for kept in (slice(0, length), slice(length + new, None)):
                assert torch.equal(now[b, kept].nan_to_num(7.0), old[b, kept].nan_to_num(7.0)), \
                    f"{name} row {b} changed outside the new keys"
    ref, _, same_dtype = reference(q_rot, after[0], after[1], [n + new for n in lengths], causal)
    assert_close_fa2(out, ref, same_dtype)


@pytest.mark.parametrize("rotary", [None, "halves"])
@pytest.mark.parametrize("new", [0, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
def test_cache_leftpad_starts_each_sequence_there(head_dim, causal, new, rotary,
                                                  poisoned_allocations):
    """FlashAttention-2's cache_leftpad: a sequence's keys are positions cache_leftpad ..
    cache_seqlens + new - 1; masks and ALiBi count from its first key, new keys go to
    cache_seqlens and rotate at their positions in the cache."""
    if rotary and not new:
        pytest.skip("rotary embeddings rotate new keys")
    dtype, batch, capacity, heads_q, heads_kv = torch.bfloat16, 4, 512, 8, 2
    lengths = [300, 1, 77, capacity - new]
    leftpad = [120, 0, 77, 5]  # a sequence whose first key is its last cached one is empty
    cache = Cache(batch, capacity, heads_kv, head_dim, dtype, lengths)
    for t in (cache.k, cache.v):  # the padding holds NaN: a kernel that reads it shows it
        for b, start in enumerate(leftpad):
            t[b, :start] = math.nan
    q = torch.randn(batch, max(new, 1), heads_q, head_dim, device="cuda").to(dtype)
    k_new = v_new = cos = sin = None
    if new:
        k_new, v_new = (torch.randn(batch, new, heads_kv, head_dim, device="cuda").to(dtype)
                        for _ in range(2))
    if rotary:
        angles = torch.rand(capacity, head_dim // 2, device="cuda") * 2 * math.pi
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slopes = torch.rand(heads_q, device="cuda") * 0.3
    out = flash_attn_with_kvcache(
        q, cache.k, cache.v, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"),
        cache_leftpad=torch.tensor(leftpad, dtype=torch.int32, device="cuda"), causal=causal,
        alibi_slopes=slopes, rotary_interleaved=False)
    q_rot = q
    if rotary:  # at their positions in the cache, not counted from the first key
        positions = torch.tensor(lengths, device="cuda")[:, None] + torch.arange(new,
                                                                              device="cuda")
        q_rot = rotate(q, cos, sin, positions if causal else positions[:, :1].expand(-1, new),
                       False).to(dtype)
    for b, (start, length) in enumerate(zip(leftpad, lengths)):
        end = length + new
        keys, values = cache.k[b:b + 1, start:end], cache.v[b:b + 1, start:end]
        ref, _ = attention_ref(q_rot[b:b + 1], keys, values, causal=causal, alibi_slopes=slopes)
        same_dtype, _ = attention_ref(q_rot[b:b + 1], keys, values, causal=causal,
                                      alibi_slopes=slopes, upcast=False)
        assert_close_fa2(out[b:b + 1], ref, same_dtype, f"out of sequence {b}")


@pytest.mark.parametrize("num_splits", [0, 1, 5])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
def test_sinks_join_every_rows_denominator(page_size, num_splits, poisoned_allocations):
    """s_aux over a cache, with the keys split or not (the combine folds the sinks in once)."""
    dtype, batch, capacity, heads_q, heads_kv, seqlen_q = torch.bfloat16, 3, 1024, 8, 2, 4
    lengths = [1000, 0, 129]  # the empty sequence: out 0, lse its sink
    cache = Cache(batch, capacity, heads_kv, 128, dtype, lengths, page_size)
    q = torch.randn(batch, seqlen_q, heads_q, 128, device="cuda").to(dtype)
    sinks = torch.randn(heads_q, device="cuda") * 3
    out, lse = flash_attn_with_kvcache(
        q, cache.k, cache.v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32,
                                                        device="cuda"),
        block_table=cache.block_table, causal=True, num_splits=num_splits, s_aux=sinks,
        return_softmax_lse=True)
    ref, ref_lse, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v),
                                         lengths, True, sinks=sinks)
    assert_close_fa2(out, ref, same_dtype)
    assert_close_fa2(lse, ref_lse, ref_lse, name="lse", eps=1e-4)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(lse[1], sinks[:, None].expand(-1, seqlen_q))


@pytest.mark.parametrize("seqlen_q", [1, 260])  # the decode kernel, and a forward on sm_90
def test_cache_batch_idx_picks_rows(seqlen_q, poisoned_allocations):
    dtype, lengths = torch.float16, [100, 200, 50]
    cache = Cache(3, 256, 2, 64, dtype, lengths)
    rows = torch.tensor([2, 0, 4], dtype=torch.int32, device="cuda")
    k, v = (torch.full((5, 256, 2, 64), math.nan, dtype=dtype, device="cuda") for _ in range(2))
    k[rows.long()], v[rows.long()] = cache.k, cache.v
    q = torch.randn(3, seqlen_q, 8, 64, device="cuda").to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, cache_batch_idx=rows)
    ref, _, same_dtype = reference(q, cache.k, cache.v, lengths, False)
    assert_close_fa2(out, ref, same_dtype)


@pytest.mark.parametrize("lse", [False, True], ids=["out", "out_lse"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
def test_a_decode_loop_attends_over_every_key_at_every_step(page_size, lse,
                                                            poisoned_allocations):
    """Steps of one signature, each with tensors of its own: the first is checked and planned,
    the others launch its plan directly (kvcache.py's known calls). Each appends a token and
    attends over every key so far; the split's workspace shares lse's allocation when lse is not
    returned."""
    dtype, batch, capacity, heads, heads_kv, head_dim = torch.bfloat16, 3, 512, 8, 2, 128
    lengths = [0, 37, 300]
    cache = Cache(batch, capacity, heads_kv, head_dim, dtype, lengths, page_size)
    for _ in range(4):
        q = torch.randn(batch, 1, heads, head_dim, device="cuda").to(dtype)
        k_new, v_new = (torch.randn(batch, 1, heads_kv, head_dim, device="cuda").to(dtype)
                        for _ in range(2))
        seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        result = flash_attn_with_kvcache(q, cache.k, cache.v, k_new, v_new,
                                         cache_seqlens=seqlens, block_table=cache.block_table,
                                         causal=True, return_softmax_lse=lse)
        lengths = [n + 1 for n in lengths]
        ref, ref_lse, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v),
                                             lengths, True)
        assert_close_fa2(result[0] if lse else result, ref, same_dtype)
        if lse:
            assert_close_fa2(result[1], ref_lse, ref_lse, name="lse", eps=1e-4)


def test_split_calls_on_two_streams_at_once_each_combine_their_own_splits(poisoned_allocations):
    """The last split of each block to finish combines, counted per stream: calls on two streams
    that overlap each get their own result, and every counter is back at 0 after them."""
    from flashgen import decode, replay

    dtype, lengths = torch.bfloat16, [4000, 9, 2500]
    cache = Cache(3, 4096, 2, 128, dtype, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    queries = [torch.randn(3, 1, 8, 128, device="cuda").to(dtype) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in queries]
    results = []
    for q, stream in zip(queries, streams):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results.append([flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                                    num_splits=7) for _ in range(20)])
    torch.cuda.synchronize()
    for q, outs in zip(queries, results):
        ref, _, same_dtype = reference(q, cache.k, cache.v, lengths, False)
        for out in outs:
            assert_close_fa2(out, ref, same_dtype)
    # Each stream's first call may be planned in Python, the rest replayed from C++: both keep
    # counters per stream.
    counters = [*decode._split_counters.values(), *replay.split_counters()]
    assert len(counters) >= 2
    assert not any(c.any() for c in counters)


def test_decode_steps_replay_in_a_cuda_graph_with_new_lengths_and_pages():
    """Capture one decode step (append + attend, paged, split) and replay it with new
    cache_seqlens and a new block table written into the captured tensors."""
    torch.manual_seed(0)
    dtype, batch, capacity, page = torch.bfloat16, 2, 2048, 16
    lengths = [1500, 7]
    cache = Cache(batch, capacity, 2, 128, dtype, lengths, page)
    for t in (cache.k, cache.v):  # every page holds keys: the replays reorder them
        t.copy_(torch.where(t.isnan(), torch.randn_like(t), t))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    table = cache.block_table.clone()
    q = torch.randn(batch, 1, 8, 128, device="cuda").to(dtype)
    k_new, v_new = (torch.randn(batch, 1, 2, 128, device="cuda").to(dtype) for _ in range(2))

    def step():
        return flash_attn_with_kvcache(q, cache.k, cache.v, k_new, v_new, cache_seqlens=seqlens,
                                       block_table=table)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm-up: loads the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for new_lengths in ([1501, 8], [20, 2000]):
        seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        table.copy_(table.flip(1))  # the same pages in another order
        graph.replay()
        torch.cuda.synchronize()
        k_logical = cache.k[table.long()].flatten(1, 2)
        v_logical = cache.v[table.long()].flatten(1, 2)
        ref, _, same_dtype = reference(q, k_logical, v_logical, [n + 1 for n in new_lengths],
                                       False)
        assert_close_fa2(out, ref, same_dtype)
        for b, n in enumerate(new_lengths):
            assert torch.equal(k_logical[b, n], k_new[b, 0])


def test_a_decode_step_compiles_without_graph_breaks():
    dtype = torch.float16
    cache = Cache(2, 256, 2, 64, dtype, [10, 100], 16)
    seqlens = torch.tensor([10, 100], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 8, 64, device="cuda").to(dtype)
    k_new, v_new = (torch.randn(2, 1, 2, 64, device="cuda").to(dtype) for _ in range(2))
    k_eager, v_eager = cache.k.clone(), cache.v.clone()
    expected = flash_attn_with_kvcache(q, k_eager, v_eager, k_new, v_new, cache_seqlens=seqlens,
                                       block_table=cache.block_table)

    @torch.compile(fullgraph=True)
    def step(q, k_cache, v_cache, k, v, seqlens, table):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                       block_table=table) * 2

    out = step(q, cache.k, cache.v, k_new, v_new, seqlens, cache.block_table)
    torch.testing.assert_close(out, expected * 2, rtol=0, atol=0, equal_nan=False)
    assert torch.equal(cache.k.nan_to_num(3.0), k_eager.nan_to_num(3.0))  # appended in place


def _inputs(dtype=torch.float16):
    cache = torch.randn(2, 64, 2, 64, device="cuda").to(dtype)
    q = torch.randn(2, 1, 4, 64, device="cuda").to(dtype)
    return q, cache, cache.clone()


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), "cache_seqlens must be int32"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), r"cache_seqlens must have shape"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].cpu()), "cache_seqlens is on cpu"),
    (lambda a: a.update(cache_seqlens=64, k=a["q"][:, :, :2], v=a["q"][:, :, :2]),
     "does not fit"),
    (lambda a: a.update(k=a["q"][:, :, :2]), "pass k and v together"),
    (lambda a: a.update(k=a["q"], v=a["q"]), r"k and v must be \(batch=2"),
    (lambda a: a.update(k=a["q"][:, :, :2], v=a["q"][:, :, :2], cache_seqlens=None),
     "pass cache_seqlens"),
    (lambda a: a.update(k_cache=a["k_cache"].float(), v_cache=a["v_cache"].float()),
     "must have one dtype"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :32]), "same shape"),
    (lambda a: a.update(q=torch.randn(2, 1, 3, 64, device="cuda").half()), "multiple of"),
    (lambda a: a.update(k_cache=torch.randn(2, 64, 2, 65, device="cuda").half()[..., :64]),
     "16-byte boundary"),
    (lambda a: a.update(block_table=torch.zeros(2, 4, dtype=torch.int64, device="cuda")),
     "block_table must be int32"),
    (lambda a: a.update(block_table=torch.zeros(3, 4, dtype=torch.int32, device="cuda")),
     r"block_table must be \(batch=2"),
    (lambda a: a.update(block_table=torch.zeros(2, 4, dtype=torch.int32, device="cuda"),
                        cache_batch_idx=torch.zeros(2, dtype=torch.int32, device="cuda")),
     "cache_batch_idx selects rows"),
    (lambda a: a.update(rotary_cos=torch.ones(64, 16, device="cuda").half()),
     "rotary_cos and rotary_sin together"),
    (lambda a: a.update(rotary_cos=torch.ones(64, 16, device="cuda").half(),
                        rotary_sin=torch.ones(64, 16, device="cuda").half()), "pass k"),
    (lambda a: a.update(rotary_cos=torch.ones(32, 16, device="cuda").half(),
                        rotary_sin=torch.ones(32, 16, device="cuda").half(),
                        k=a["q"][:, :, :2], v=a["q"][:, :, :2]), "fewer than the cache's 64"),
    (lambda a: a.update(rotary_cos=torch.ones(64, 40, device="cuda").half(),
                        rotary_sin=torch.ones(64, 40, device="cuda").half(),
                        k=a["q"][:, :, :2], v=a["q"][:, :, :2]), "rotary_dim"),
    (lambda a: a.update(rotary_cos=torch.ones(64, 16, device="cuda"),
                        rotary_sin=torch.ones(64, 16, device="cuda"),
                        k=a["q"][:, :, :2], v=a["q"][:, :, :2]), "q's dtype"),
    (lambda a: a.update(num_splits=-1), "num_splits must be an int >= 0"),
    (lambda a: a.update(window_size=(-3, 0)), "window_size"),
    (lambda a: a.update(softcap=-30.0), "softcap must be a finite number >= 0"),
    (lambda a: a.update(alibi_slopes=torch.ones(3, device="cuda")),
     r"alibi_slopes must have shape \(nheads,\) = \(4,\)"),
    (lambda a: a.update(cache_leftpad=a["cache_seqlens"][:1]), r"cache_leftpad must have shape"),
    (lambda a: a.update(cache_leftpad=a["cache_seqlens"],
                        block_table=torch.zeros(2, 4, dtype=torch.int32, device="cuda")),
     "cache_leftpad left-pads a contiguous cache"),
    (lambda a: a.update(s_aux=torch.zeros(4, device="cuda").half()), "s_aux .* float32"),
    (lambda a: a.update(s_aux=torch.zeros(2, device="cuda")), r"s_aux .* \(nheads,\) = \(4,\)"),
    (lambda a: a.update(s_aux=torch.zeros(4, device="cuda"),
                        learnable_sink=torch.zeros(4, device="cuda")), "pass one"),
])
def test_bad_input_names_the_argument(change, message):
    q, k_cache, v_cache = _inputs()
    arguments = dict(q=q, k_cache=k_cache, v_cache=v_cache, k=None, v=None,
                     cache_seqlens=torch.full((2,), 5, dtype=torch.int32, device="cuda"))
    change(arguments)
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=message):
        flash_attn_with_kvcache(**arguments)


@pytest.mark.parametrize("case, message", [
    ("lengths", "cache_seqlens spans"), ("pages", r"block_table\[1, 2\] = 99"),
    ("rows", "cache_batch_idx holds"), ("leftpad", r"cache_leftpad\[1\] = 41"),
])
def test_debug_checks_read_device_values(case, message, monkeypatch):
    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")
    q, k_cache, v_cache = _inputs()
    seqlens = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    arguments = dict(cache_seqlens=seqlens)
    if case == "lengths":
        seqlens[1] = 65
    elif case == "pages":
        paged = k_cache.view(8, 16, 2, 64)
        arguments.update(block_table=torch.tensor([[0, 1, 2, 3], [4, 5, 99, -1]],
                                                  dtype=torch.int32, device="cuda"))
        k_cache, v_cache = paged, paged.clone()
    elif case == "rows":
        arguments.update(cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32,
                                                      device="cuda"))
    else:  # a first key after the cached ones
        arguments.update(cache_leftpad=torch.tensor([0, 41], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match=message):
        flash_attn_with_kvcache(q, k_cache, v_cache, **arguments)
    if case == "pages":  # -1 marks a page this call does not read: accepted
        arguments["block_table"][1, 2] = 6
        flash_attn_with_kvcache(q, k_cache, v_cache, **arguments)
