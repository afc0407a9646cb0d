"""flash_attn_with_kvcache checks a call's signature once (flashgen/kvcache.py's recipes): a
call like one that passed runs on its own tensors without the checks, any other call is checked,
on a CPU (the CUDA-only check stubbed, the kernels' op faked)."""

import weakref

import pytest

torch = pytest.importorskip("torch")

from flashgen import kvcache, validate  # noqa: E402


@pytest.fixture
def calls(monkeypatch):
    """The op's arguments per call, and how many calls were checked."""
    record = {"arguments": [], "checked": 0}
    monkeypatch.setattr(validate, "check_qkv", lambda *args, **kwargs: None)
    monkeypatch.setattr(kvcache.ops, "attention_with_kvcache",
                        lambda arguments, out=None: (record["arguments"].append(arguments),
                                                     (None, None))[1])
    checked = kvcache._arguments

    def counting(*args):
        record["checked"] += 1
        return checked(*args)

    monkeypatch.setattr(kvcache, "_arguments", counting)
    return record


def step(batch=2, dim=64, dtype=torch.bfloat16):
    q = torch.randn(batch, 1, 8, dim, dtype=dtype)
    cache = torch.randn(batch, 128, 2, dim, dtype=dtype)
    return q, cache, torch.randn_like(cache), torch.tensor([5, 7][:batch], dtype=torch.int32)


def test_a_call_like_one_that_passed_runs_on_its_own_tensors_unchecked(calls):
    first, second = step(), step()
    for q, k_cache, v_cache, lengths in (first, second):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True,
                                        softcap=5.0)
    assert calls["checked"] == 1
    one, two = calls["arguments"]
    assert [a is b for a, b in zip(two, one) if isinstance(a, torch.Tensor)] == [False] * 4
    assert two[:3] == second[:3] and two[7] is second[3]
    assert [a for a in two if not isinstance(a, torch.Tensor)] == [
        a for a in one if not isinstance(a, torch.Tensor)]


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "causal", "window"])
def test_any_other_call_is_checked(calls, change):
    q, k_cache, v_cache, lengths = step()
    kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    options = {}
    if change == "shape":
        q, k_cache, v_cache, lengths = step(batch=1)
    elif change == "dtype":
        q, k_cache, v_cache, lengths = step(dtype=torch.float16)
    elif change == "strides":
        q = torch.randn(2, 8, 1, 64, dtype=torch.bfloat16).transpose(1, 2)
    elif change == "causal":
        options = {"causal": True}
    else:
        options = {"window_size": (16, 0)}
    kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, **options)
    assert calls["checked"] == 2


def test_a_call_that_makes_a_tensor_or_fails_keeps_no_recipe(calls):
    q, k_cache, v_cache, _ = step()
    for _ in range(2):  # an int cache_seqlens becomes a tensor per call
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=9)
    assert calls["checked"] == 2
    for _ in range(2):
        with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
            kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=-1)
    assert calls["checked"] == 4


def test_a_value_of_another_type_is_checked_as_it_is(calls):
    """True equals 1 to a dict, not to the checks: num_splits=True raises after num_splits=1."""
    q, k_cache, v_cache, lengths = step()
    kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=1)
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                        num_splits=True)


def test_a_tensor_where_a_number_goes_is_read_every_call(calls):
    q, k_cache, v_cache, lengths = step()
    for scale in (0.5, 0.25):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                        softmax_scale=torch.tensor(scale))
    assert calls["checked"] == 2
    assert [a[11] for a in calls["arguments"]] == [0.5, 0.25]


def test_debug_checks_check_every_call(calls, monkeypatch):
    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")
    q, k_cache, v_cache, lengths = step()
    for _ in range(2):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert calls["checked"] == 2


# --- a known call launches decode's plan directly (tests/kernel_mock.py's kernels) ------------

@pytest.fixture
def launched(monkeypatch):
    """The real call path down to the binding, whose launches record their arguments: the
    decode launches' fields by name, and how many calls went through ops.attention_with_kvcache
    (the checked op path)."""
    from codegen import params
    from tests import kernel_mock

    record = kernel_mock.install(monkeypatch)
    through_ops, real = [], kvcache.ops.attention_with_kvcache
    monkeypatch.setattr(kvcache.ops, "attention_with_kvcache",
                        lambda *a, **k: through_ops.append(1) or real(*a, **k))

    def fields():
        launches = [dict(zip(params.DecodeArgs._fields, args[2:]))
                    for entry, args in record.launches if entry == "decode"]
        record.launches.clear()
        return launches

    return fields, through_ops


def test_a_known_call_launches_the_plan_with_its_own_tensors(launched):
    fields, through_ops = launched
    first, second = step(), step()
    kvcache.flash_attn_with_kvcache(*first[:3], cache_seqlens=first[3], causal=True)
    (planned,) = fields()
    out = kvcache.flash_attn_with_kvcache(*second[:3], cache_seqlens=second[3], causal=True)
    (direct,) = fields()
    assert len(through_ops) == 1
    q, k_cache, v_cache, lengths = second
    own = {"q": q.data_ptr(), "k": k_cache.data_ptr(), "v": v_cache.data_ptr(),
           "cache_seqlens": lengths.data_ptr(), "o": out.data_ptr()}
    assert {name: direct[name] for name in own} == own
    allocated = {"softmax_lse", "o_accum", "lse_accum"}
    assert ({n: v for n, v in planned.items() if n not in {*own, *allocated}}
            == {n: v for n, v in direct.items() if n not in {*own, *allocated}})


def test_without_lse_a_call_keeps_lse_and_the_split_workspace_in_the_streams_scratch(launched):
    """The splits' o_accum and lse_accum, then the call's lse rows, in the stream's scratch:
    the same addresses call after call (no allocation), the lse rows past the workspace."""
    fields, _ = launched
    q, k_cache, v_cache, lengths = step()
    for _ in range(3):
        out = kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                              num_splits=3)
    planned, *direct = fields()
    assert isinstance(out, torch.Tensor) and direct[0]["num_splits"] == 3
    lse_rows = q.shape[0] * q.shape[2] * q.shape[1]
    workspace = 3 * lse_rows * (q.shape[-1] + 1)
    for launch in direct:
        assert launch["softmax_lse"] == launch["o_accum"] + 4 * workspace
        assert launch["lse_accum"] - launch["o_accum"] == 4 * 3 * lse_rows * q.shape[-1]
    assert direct[0]["o_accum"] == direct[1]["o_accum"]


def test_in_a_capture_the_calls_own_scratch_lives_until_its_launch(launched, monkeypatch):
    """A CUDA graph's capture allocates its own scratch, which must not be freed (and handed to
    the counters or another buffer) before the launch that uses it is queued."""
    from flashgen import decode, host

    made, alive_at_launch = [], []
    real_scratch, real_call = decode.stream_scratch, host.call_on_device

    def scratch(*args):
        t = real_scratch(*args)
        made.append(weakref.ref(t))
        return t

    def call(*args):
        alive_at_launch.append(made[-1]() is not None)
        return real_call(*args)

    monkeypatch.setattr(host, "stream_capturing", lambda: True)
    monkeypatch.setattr(decode, "stream_scratch", scratch)
    monkeypatch.setattr(host, "call_on_device", call)
    q, k_cache, v_cache, lengths = step()
    for _ in range(2):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=3)
    assert len(made) == 2 and alive_at_launch == [True, True]
    assert not decode._scratch  # nothing kept for a capture


def test_a_call_that_returns_lse_gets_its_own(launched):
    fields, _ = launched
    q, k_cache, v_cache, lengths = step()
    lses = [kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                            num_splits=3, return_softmax_lse=True)[1]
            for _ in range(2)]
    launches = fields()
    assert [launch["softmax_lse"] for launch in launches] == [lse.data_ptr() for lse in lses]
    assert lses[0].data_ptr() != lses[1].data_ptr()


def test_a_known_call_on_unaligned_tensors_is_planned_apart(launched):
    """The same shapes and strides at an address that is no multiple of 16 bytes: the checked
    path copies q to an aligned one."""
    fields, through_ops = launched
    q, k_cache, v_cache, lengths = step()
    kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    assert shifted.stride() == q.stride() and shifted.data_ptr() % 16
    kvcache.flash_attn_with_kvcache(shifted, k_cache, v_cache, cache_seqlens=lengths)
    assert len(through_ops) == 2
    assert [launch["q"] % 16 for launch in fields()] == [0, 0]


def test_a_known_call_goes_through_the_op_where_something_sees_ops(launched, monkeypatch):
    """torch.compile, a dispatch mode or a functorch transform sees the op, as it does for any
    call."""
    fields, through_ops = launched
    q, k_cache, v_cache, lengths = step()
    kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    monkeypatch.setattr(kvcache.ops, "nothing_sees_ops", lambda: False)
    with torch.library._scoped_library("flashgen", "IMPL") as library:
        # the dispatcher sends the mock's tensors to the CPU key
        library.impl("fwd_kvcache", kvcache.ops._fwd_kvcache_cuda, "CPU")
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert len(through_ops) == 2 and len(fields()) == 2
