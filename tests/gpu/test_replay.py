"""The compiled replay of known calls (flashgen/replay.py): a flash_attn_with_kvcache,
flash_attn_func or flash_attn_varlen_func call of a signature planned before (the forwards'
without autograd), and the dense backward of a flash_attn_func call, launches from C++ and gives
what the Python path gives, bit for bit, outputs poisoned either way; a call of any other
signature, an unaligned one, a forward that autograd records or autocast casts, a backward of an
expanded gradient or under create_graph, and any call under FLASHGEN_DEBUG_CHECKS=1 runs from
Python; CUDA graphs capture replayed calls."""

import math

import pytest
import torch

from flashgen import (decode, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
                      replay)
from flashgen.reference import assert_close_fa2
from tests.gpu.test_kvcache import Cache, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module", autouse=True)
def replay_built():
    """The replay, built for this torch and loaded (a build failure fails every test here)."""
    from codegen import build

    build.build_replay()
    replay.reset()
    yield
    replay.reset()


def _python(fn, monkeypatch):
    """fn() with the replay off: decode's plans run from Python."""
    with monkeypatch.context() as m:
        m.setenv("FLASHGEN_REPLAY", "0")
        replay.reset()
        result = fn()
    replay.reset()
    return result


def _replayed(fn):
    """fn() as the replay launches it: fn runs until a call of it is replayed (its first
    call in a fresh process is planned in Python), and that call's result is returned."""
    for _ in range(3):
        before = replay.replays()
        result = fn()
        if replay.replays() > before:
            return result
    raise AssertionError("the call was never replayed")


def _restoring(fn, *tensors):
    """fn with tensors (caches it appends to) restored to their state now before each call."""
    saved = [t.clone() for t in tensors]

    def call():
        for t, s in zip(tensors, saved):
            t.copy_(s)
        return fn()
    return call


def _assert_equal(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if y is None:  # return_attn_probs's third
            assert x is None
            continue
        assert not x.isnan().any(), "an output element was never written"
        assert torch.equal(x, y)


CASES = {
    # the bench's decode step: batch 1, 32 / 8 heads, a 1k cache, split
    "dense_split": dict(batch=1, heads=(32, 8), head_dim=128, lengths=[1024], capacity=1024),
    "dense_lse": dict(batch=1, heads=(32, 8), head_dim=128, lengths=[1000], capacity=1024,
                      lse=True),
    "page16_hd64_lse": dict(batch=3, heads=(16, 2), head_dim=64, lengths=[0, 517, 2000],
                            capacity=2048, page_size=16, lse=True),
    "append_rotary": dict(batch=2, heads=(8, 2), head_dim=128, lengths=[3, 700],
                          capacity=1024, new=1, rotary=True),
    "append_page1_four_tokens": dict(batch=2, heads=(8, 8), head_dim=64, lengths=[9, 300],
                                     capacity=512, new=4, page_size=1, causal=True),
    "batch_idx": dict(batch=2, heads=(8, 2), head_dim=128, lengths=[60, 900], capacity=1024,
                      batch_idx=True),
    "alibi_softcap": dict(batch=2, heads=(8, 2), head_dim=128, lengths=[33, 1024],
                          capacity=1024, alibi=True, softcap=20.0),
    "sinks_window": dict(batch=2, heads=(8, 2), head_dim=64, lengths=[100, 1500],
                         capacity=2048, sinks=True, window=(256, 0)),
    "forced_splits": dict(batch=2, heads=(8, 2), head_dim=128, lengths=[77, 999],
                          capacity=1024, num_splits=5),
}


def _case(batch, heads, head_dim, lengths, capacity, page_size=None, new=0, rotary=False,
          causal=False, batch_idx=False, alibi=False, softcap=0.0, sinks=False,
          window=(-1, -1), num_splits=0, lse=False):
    """(call, the caches it appends to) for a case of CASES."""
    dtype = torch.bfloat16
    heads_q, heads_kv = heads
    rows = batch + 2 if batch_idx else batch
    cache = Cache(rows, capacity, heads_kv, head_dim, dtype,
                  lengths + [capacity // 2] * (rows - batch), page_size)
    seqlen_q = max(1, new)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda").to(dtype)
    kw = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"),
              block_table=cache.block_table, causal=causal, window_size=window,
              softcap=softcap, num_splits=num_splits, return_softmax_lse=lse)
    if new:
        kw["k"], kw["v"] = (torch.randn(batch, new, heads_kv, head_dim, device="cuda").to(dtype)
                            for _ in range(2))
    if rotary:
        angles = torch.rand(capacity, head_dim // 4, device="cuda") * 2 * math.pi
        kw["rotary_cos"], kw["rotary_sin"] = angles.cos().to(dtype), angles.sin().to(dtype)
        kw["rotary_interleaved"] = False
    if batch_idx:
        kw["cache_batch_idx"] = torch.tensor([rows - 1, 0], dtype=torch.int32, device="cuda")
    if alibi:
        kw["alibi_slopes"] = torch.rand(heads_q, device="cuda") * 0.3
    if sinks:
        kw["s_aux"] = torch.randn(heads_q, device="cuda")

    def call():
        return flash_attn_with_kvcache(q, cache.k, cache.v, **kw)
    return _restoring(call, cache.k, cache.v), (cache.k, cache.v)


@pytest.mark.parametrize("name", CASES)
def test_a_replayed_call_gives_what_python_gives(name, poisoned_allocations, monkeypatch):
    call, caches = _case(**CASES[name])
    expected = _python(call, monkeypatch)
    expected_caches = [t.clone() for t in caches]
    _assert_equal(_replayed(call), expected)
    for t, e in zip(caches, expected_caches):
        assert torch.equal(t.nan_to_num(1.5), e.nan_to_num(1.5))  # the same keys appended


def test_other_signatures_run_from_python(poisoned_allocations):
    """A kept signature replays; another shape, dtype or stride, and an address that is not a
    multiple of 16 bytes (which Python copies), do not, and still attend correctly."""
    lengths = [300, 1000]
    cache = Cache(2, 1024, 2, 128, torch.bfloat16, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 8, 128, device="cuda").to(torch.bfloat16)
    _replayed(lambda: flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens))
    storage = torch.randn(2 * 8 * 128 + 1, device="cuda").to(torch.bfloat16)
    others = {
        "one sequence": (q[:1], [300]),
        "strided heads": (torch.randn(2, 1, 16, 128, device="cuda").to(torch.bfloat16)[:, :, ::2],
                          lengths),
        "unaligned": (storage[1:].view(2, 1, 8, 128), lengths),
    }
    for what, (other, other_lengths) in others.items():
        before = replay.replays()
        out = flash_attn_with_kvcache(other, cache.k, cache.v, cache_seqlens=seqlens[
            :len(other_lengths)])
        assert replay.replays() == before, what
        ref, _, same_dtype = reference(other, cache.k, cache.v, other_lengths, False)
        assert_close_fa2(out, ref, same_dtype)
    before = replay.replays()
    flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens, softmax_scale=0.1)
    assert replay.replays() == before, "another value of a number"


def test_debug_checks_run_from_python(monkeypatch):
    lengths = [300, 1000]
    cache = Cache(2, 1024, 2, 128, torch.bfloat16, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 8, 128, device="cuda").to(torch.bfloat16)
    _replayed(lambda: flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens))
    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")
    seqlens.fill_(1025)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens)


def test_a_cuda_graph_captures_a_replayed_step_with_new_lengths():
    """The capture replays from C++ (its workspace and counters the graph's own); the graph then
    replays with new lengths written into the captured tensor."""
    torch.manual_seed(0)
    lengths = [1500, 7]
    cache = Cache(2, 2048, 2, 128, torch.bfloat16, lengths, 16)
    for t in (cache.k, cache.v):
        t.copy_(torch.where(t.isnan(), torch.randn_like(t), t))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 8, 128, device="cuda").to(torch.bfloat16)

    def step():
        return flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens,
                                       block_table=cache.block_table, return_softmax_lse=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _replayed(step)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    before = replay.replays()
    with torch.cuda.graph(graph):
        out, lse = step()
    assert replay.replays() == before + 1
    for new_lengths in ([1501, 8], [20, 2000]):
        seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse, same_dtype = reference(q, cache.logical(cache.k), cache.logical(cache.v),
                                             new_lengths, False)
        assert_close_fa2(out, ref, same_dtype)
        assert_close_fa2(lse, ref_lse, ref_lse, name="lse", eps=1e-4)


def test_kept_plans_go_with_decodes_plans():
    cache = Cache(1, 256, 2, 128, torch.bfloat16, [100])
    q = torch.randn(1, 1, 8, 128, device="cuda").to(torch.bfloat16)
    seqlens = torch.tensor([100], dtype=torch.int32, device="cuda")
    _replayed(lambda: flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens))
    decode.clear_plans()
    before = replay.replays()
    flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=seqlens)
    assert replay.replays() == before  # planned again first


def _qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, requires_grad=False):
    shapes = ((batch, seqlen_q, heads, head_dim), (batch, seqlen_k, heads_kv, head_dim),
              (batch, seqlen_k, heads_kv, head_dim))
    return [torch.randn(shape, device="cuda").to(torch.bfloat16).requires_grad_(requires_grad)
            for shape in shapes]


def _dense(batch=2, seqlen_q=300, seqlen_k=300, heads=8, heads_kv=8, head_dim=128, **kwargs):
    q, k, v = _qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
    return lambda: flash_attn_func(q, k, v, **kwargs)


def _varlen(lengths_q, lengths_k, heads=8, heads_kv=2, head_dim=64, used=None, **kwargs):
    q, k, v = (t[0] for t in _qkv(1, sum(lengths_q), sum(lengths_k), heads, heads_kv,
                                   head_dim))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                               device="cuda") for n in (lengths_q, lengths_k))
    if used is not None:
        kwargs["seqused_k"] = torch.tensor(used, dtype=torch.int32, device="cuda")
    return lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                          **kwargs)


FORWARDS = {
    "tiny": lambda: _dense(1, 64, 64, 1, 1, 64),  # bench --overhead's cell
    "causal_odd": lambda: _dense(2, 257, 300, 8, 8, 128, causal=True),
    "gqa_window_probs": lambda: _dense(2, 300, 300, 8, 2, 64, window_size=(64, 0),
                                       return_attn_probs=True),
    "scaled": lambda: _dense(1, 128, 512, 4, 4, 128, softmax_scale=0.05),
    "varlen_causal_lse": lambda: _varlen([5, 300, 1], [5, 310, 40], causal=True,
                                         return_softmax_lse=True),
    "varlen_seqused_k": lambda: _varlen([3, 200], [100, 250], used=[60, 250]),
}


@pytest.mark.parametrize("name", FORWARDS)
def test_a_replayed_forward_gives_what_python_gives(name, poisoned_allocations, monkeypatch):
    call = FORWARDS[name]()
    with torch.no_grad():
        expected = _python(call, monkeypatch)
    _assert_equal(_replayed(call), expected)  # grad enabled: its inputs need none


def test_forwards_that_autograd_records_or_autocast_casts_run_from_python():
    q, k, v = _qkv(2, 128, 128, 4, 4, 64)
    _replayed(lambda: flash_attn_func(q, k, v))
    before = replay.replays()
    with torch.autocast("cuda", dtype=torch.bfloat16):  # Python casts (here to the same dtype)
        out = flash_attn_func(q, k, v)
    assert out.dtype == torch.bfloat16 and replay.replays() == before
    grad_q = q.detach().requires_grad_()
    out = flash_attn_func(grad_q, k, v)
    out.float().sum().backward()
    assert replay.replays() == before and grad_q.grad is not None


def _training(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, **kwargs):
    """A training step's gradients: flash_attn_func forward, then backward of one fixed dout;
    returns (dq, dk, dv)."""
    q, k, v = _qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, requires_grad=True)
    dout = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda").to(torch.bfloat16)

    def call():
        for t in (q, k, v):
            t.grad = None
        flash_attn_func(q, k, v, **kwargs).backward(dout)
        return q.grad, k.grad, v.grad
    return call


# Deterministic backwards compare bit for bit; "atomic" adds dq in whatever order the blocks
# finish, so it compares within a rounding.
BACKWARDS = {
    "tiny": lambda: _training(1, 64, 64, 1, 1, 64, deterministic=True),  # bench --overhead's
    "causal_odd_gqa": lambda: _training(2, 257, 300, 8, 2, 128, causal=True,
                                        deterministic=True),
    "window_hd64": lambda: _training(2, 300, 300, 8, 8, 64, window_size=(64, 0),
                                     deterministic=True),
    "scaled_softcap": lambda: _training(1, 128, 512, 4, 4, 128, softmax_scale=0.05,
                                        softcap=20.0, deterministic=True),
    "atomic": lambda: _training(2, 300, 300, 8, 2, 128),
}


@pytest.fixture
def backward_replay(monkeypatch):
    """The backward's replay on (FLASHGEN_REPLAY_BACKWARD=1)."""
    monkeypatch.setenv("FLASHGEN_REPLAY_BACKWARD", "1")
    replay.reset()
    yield
    monkeypatch.delenv("FLASHGEN_REPLAY_BACKWARD")
    replay.reset()


@pytest.mark.parametrize("name", BACKWARDS)
def test_a_replayed_backward_gives_what_python_gives(name, backward_replay, poisoned_allocations,
                                                     monkeypatch):
    call = BACKWARDS[name]()
    expected = tuple(g.clone() for g in _python(call, monkeypatch))
    replayed = _replayed(call)
    if name == "atomic":
        for x, y in zip(replayed, expected):
            assert not x.isnan().any(), "a gradient element was never written"
            torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2)
    else:
        _assert_equal(replayed, expected)


def test_backwards_of_an_expanded_gradient_or_a_double_backward_run_from_python(
        backward_replay):
    call = BACKWARDS["tiny"]()
    _replayed(call)
    q, k, v = _qkv(1, 64, 64, 1, 1, 64, requires_grad=True)
    before = replay.replays()
    flash_attn_func(q, k, v, deterministic=True).sum().backward()  # dout expanded: copied
    out = flash_attn_func(q, k, v, deterministic=True)
    (dq,) = torch.autograd.grad(out, q, torch.randn_like(out), create_graph=True)
    assert replay.replays() == before and q.grad is not None and dq.requires_grad


def test_the_backwards_replay_is_off_by_default():
    call = BACKWARDS["tiny"]()
    for _ in range(3):
        before = replay.replays()
        call()
        assert replay.replays() == before
