"""The argument checks that need no GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from codegen.params import WINDOW_UNBOUNDED  # noqa: E402
from flashgen import flash_attn_func, scaled_dot_product_attention, validate  # noqa: E402


def cpu_qkv():
    return [torch.randn(1, 16, 2, 64, dtype=torch.bfloat16) for _ in range(3)]


def test_cpu_tensors_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"q is on cpu.*\.cuda\(\)"):
        flash_attn_func(*cpu_qkv())


def test_sdpa_cpu_tensors():
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query is on cpu"):
        scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("dropout_p", [-0.1, 1.0, 1.5, float("nan"), "0.1", True])
def test_bad_dropout_p_names_the_argument(dropout_p):
    for call in (lambda: flash_attn_func(*cpu_qkv(), dropout_p=dropout_p),
                 lambda: scaled_dot_product_attention(*cpu_qkv(), dropout_p=dropout_p)):
        with pytest.raises(ValueError, match=r"dropout_p must be a number in \[0, 1\)"):
            call()


@pytest.mark.parametrize("slopes, error, message", [
    ([1.0], TypeError, "alibi_slopes must be a torch.Tensor"),
    (torch.ones(3), ValueError, r"alibi_slopes must have shape \(nheads,\) = \(2,\) or \(batch, "
                                r"nheads\) = \(1, 2\)"),
    (torch.ones(2, dtype=torch.float64), TypeError, "alibi_slopes must be float32"),
])
def test_bad_alibi_slopes_name_the_argument(slopes, error, message):
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(error, match=message):
        validate.modifiers(0.0, slopes, q, batch=1)


@pytest.mark.parametrize("softcap", [-1.0, float("inf"), float("nan"), "30", True])
def test_bad_softcaps_name_the_argument(softcap):
    with pytest.raises(ValueError, match="softcap"):
        validate.check_softcap(softcap)


@pytest.mark.parametrize("window", [(-2, 0), (0, -5), (1.5, 2), (3,), "wide", None,
                                    (torch.tensor(1.5), 0), (torch.tensor([3]), 0)])
def test_bad_windows_name_the_argument(window):
    with pytest.raises(ValueError, match="window_size"):
        validate.band(False, window, 16, 16, 0)


def test_window_bounds_may_be_zero_dim_integer_tensors():
    """FlashAttention-2's tests draw windows with torch.randint and pass the 0-d tensors."""
    assert validate.check_window((torch.tensor(16), torch.tensor(4))) == (16, 4)
    assert validate.check_window(torch.tensor([16, 4]).unbind()) == (16, 4)


@pytest.mark.parametrize("sinks, error, message", [
    ([0.0, 0.0], TypeError, "must be a torch.Tensor"),
    (torch.zeros(3), ValueError, r"shape \(nheads,\) = \(2,\)"),
    (torch.zeros(2, dtype=torch.bfloat16), TypeError, "must be float32"),
])
def test_bad_sinks_name_the_argument(sinks, error, message):
    q = cpu_qkv()[0]
    with pytest.raises(error, match=message):
        validate.with_sinks(validate.PLAIN, sinks, q)


def test_sinks_have_two_names_and_one_value():
    s = torch.zeros(2)
    assert validate.sink_argument(s, None) is s and validate.sink_argument(None, s) is s
    with pytest.raises(ValueError, match="pass one"):
        validate.sink_argument(s, s)


# (causal, window_size, seqlen_q, seqlen_k) -> (mask kind, left, right); U: unbounded.
# FlashAttention-2's semantics: causal sets right to 0; a bound that hides nothing counts as
# unbounded, so such calls run the causal or the dense kernel.
U = WINDOW_UNBOUNDED


@pytest.mark.parametrize("causal, window, sq, sk, expected", [
    (False, (-1, -1), 100, 100, ("none", U, U)),
    (True, (-1, -1), 100, 100, ("causal", U, 0)),
    (True, (-1, 7), 100, 100, ("causal", U, 0)),
    (True, (16, -1), 100, 100, ("window", 16, 0)),
    (False, (16, 4), 100, 120, ("window", 16, 4)),
    (False, (-1, 4), 100, 120, ("window", U, 4)),
    (False, (99, 99), 100, 100, ("none", U, U)),      # wider than the sequences
    (False, (119, 98), 100, 120, ("window", U, 98)),  # keys 0..119: the left bound hides none
    (True, (119, 0), 100, 120, ("causal", U, 0)),
    (True, (5000, -1), 1, 300, ("none", U, U)),      # one query sees every key
    (False, (-1, 0), 300, 1, ("causal", U, 0)),      # one key, that rows 0..298 come before
    (False, (-1, 0), 1, 300, ("none", U, U)),        # one query, after every key
])
def test_windows_become_a_mask_kind_and_band(causal, window, sq, sk, expected):
    mask, band = validate.band(causal, window, sq, sk, sk - sq)
    assert (mask, band.left, band.right) == expected and band.offset == sk - sq


def test_non_tensor():
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        flash_attn_func([1.0], *cpu_qkv()[1:])


# --- the one-pass check of the common call against the detailed checks -------------------------

CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def tensors_report_their_pretend_device(monkeypatch):
    """CPU tensors that report to Python the device in their `pretend` attribute (cuda:0 unless
    set), so the checks, which read only these attributes, run on a CPU."""
    def device(t):
        return getattr(t, "pretend", CUDA0)

    monkeypatch.setattr(torch.Tensor, "device", property(device))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: device(t).type == "cuda"))
    monkeypatch.setattr(torch.Tensor, "get_device",
                        lambda t: device(t).index if device(t).type == "cuda" else -1)


def bshd(b=2, sq=64, sk=64, h=4, hk=4, d=64, dtype=torch.bfloat16):
    return [torch.randn(b, sq, h, d).to(dtype), torch.randn(b, sk, hk, d).to(dtype),
            torch.randn(b, sk, hk, d).to(dtype)]


def replaced(tensors, index, value):
    tensors = list(tensors)
    tensors[index] = value
    return tensors


def on(device, t):
    t.pretend = torch.device(device)
    return t


def heads_first(t):
    """The (batch, heads, seq, dim) view, of the same type on the same pretend device."""
    view = t.transpose(1, 2)
    if type(t) is torch.nn.Parameter:
        view = torch.nn.Parameter(view)
    if hasattr(t, "pretend"):
        view.pretend = t.pretend
    return view


# name: (q, k, v) in (batch, seq, heads, dim), built under the fixture
TENSOR_CASES = {
    "common": lambda: bshd(),
    "gqa": lambda: bshd(h=8, hk=2),
    "fp16": lambda: bshd(dtype=torch.float16),
    "strided_views": lambda: [t[:, ::2] for t in bshd()],
    "no_query_rows": lambda: bshd(sq=0),
    "cpu_key": lambda: replaced(bshd(), 1, on("cpu", bshd()[1])),
    "other_gpu_value": lambda: replaced(bshd(), 2, on("cuda:1", bshd()[2])),
    "mixed_dtypes": lambda: replaced(bshd(), 2, bshd(dtype=torch.float16)[2]),
    "fp32": lambda: bshd(dtype=torch.float32),
    "integer": lambda: bshd(dtype=torch.int32),
    "rank3": lambda: [t[0] for t in bshd()],
    "rank3_key": lambda: replaced(bshd(), 1, bshd()[1][0]),
    "batch_mismatch": lambda: replaced(bshd(), 0, bshd(b=3)[0]),
    "head_dim_mismatch": lambda: replaced(bshd(), 0, bshd(d=128)[0]),
    "kv_seqlen_mismatch": lambda: replaced(bshd(), 2, bshd(sk=65)[2]),
    "heads_not_multiple": lambda: bshd(h=6, hk=4),
    "no_key_heads": lambda: bshd(hk=0),
    "head_dim_not_contiguous": lambda: [t.transpose(2, 3).contiguous().transpose(2, 3)
                                        for t in bshd()],
    "head_dim_1_strided": lambda: [t[..., ::2] for t in bshd(d=2)],
    "not_a_tensor": lambda: replaced(bshd(), 0, [[1.0]]),
    "parameter": lambda: replaced(bshd(), 0, torch.nn.Parameter(bshd()[0])),
}
# Good inputs that the one-pass check leaves to the detailed checks.
DETAILED_ONLY = {"head_dim_1_strided", "parameter"}


def detailed_checks_pass(check) -> bool:
    try:
        check()
    except (TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_one_pass_check_agrees_with_the_detailed_checks(tensors_report_their_pretend_device,
                                                         case):
    from flashgen import attention, validate

    q, k, v = TENSOR_CASES[case]()
    good = detailed_checks_pass(lambda: (validate.check_qkv(("q", "k", "v"), q, k, v),
                                         validate.check_shapes(("q", "k", "v"), q, k, v, "")))
    assert validate.passes_tensor_checks(q, k, v, heads_axis=2) == (good and
                                                                    case not in DETAILED_ONLY)
    query, key, value = (heads_first(t) if isinstance(t, torch.Tensor) and t.dim() == 4 else t
                         for t in (q, k, v))
    good_sdpa = detailed_checks_pass(lambda: attention._check_sdpa_tensors(query, key, value))
    assert good_sdpa == good
    assert validate.passes_tensor_checks(query, key, value, heads_axis=1) == (
        good and case not in DETAILED_ONLY)


@pytest.mark.parametrize("mask, error, message", [
    (torch.ones(3, 8, 8, dtype=torch.bool), ValueError, r"does not broadcast to \(batch, heads, "),
    (torch.ones(8, 8, dtype=torch.int64), TypeError, "boolean or floating point"),
    ([[True]], TypeError, "attn_mask must be a torch.Tensor"),
])
def test_bad_attn_masks_name_the_argument(mask, error, message):
    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)  # (batch, seq, heads, dim)
    with pytest.raises(error, match=message):
        validate.attn_bias(mask, q, seqlen_k=8)


def test_a_boolean_attn_mask_becomes_a_broadcast_bias():
    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    padding = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    padding[1, ..., 3:] = False
    bias = validate.attn_bias(padding, q, seqlen_k=5)
    assert bias.shape == (2, 4, 8, 5) and bias.dtype == torch.float32
    assert bias.stride()[1:3] == (0, 0) and bias.stride(-1) == 1  # broadcast, not copied
    assert (bias[0] == 0).all() and torch.isneginf(bias[1, ..., 3:]).all()



def test_a_score_variant_replaces_the_score_modifier_and_keeps_the_mask():
    from flashgen import variant_args
    from flashgen.band import Band
    from flashgen.modifiers import PLAIN

    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)  # (batch, seq, heads, dim)
    bias = torch.randn(4, 15)
    mask, band, mods = variant_args.prepare("relative_bias", {"bias": bias}, None, q, q, 2, 8, 8,
                                            "causal", Band(0), PLAIN)
    assert mask == "causal" and band == Band(0)
    assert mods.score_mod == "relative_bias" and mods.variant.name == "relative_bias"
    assert mods.variant_tensors == (bias,) and mods.attn_bias is None
    assert mods.mask_ranges is None and mods.alibi_slopes is None


def test_a_mask_variant_takes_its_block_mask_ranges():
    from flashgen import variant_args, variants
    from flashgen.band import Band
    from flashgen.modifiers import PLAIN

    q = torch.randn(2, 32, 4, 64, dtype=torch.bfloat16)
    doc_ids = torch.zeros(2, 32, dtype=torch.int32)
    document = variants.resolve("document")
    ranges = torch.zeros(variants.block_mask_shape(document, 2, 4, 32, 32), dtype=torch.int32)
    block_mask = variant_args.BlockMask("document", ranges, 2, 32, 32)
    mask, _, mods = variant_args.prepare("document", {"doc_ids": doc_ids}, block_mask, q, q, 2, 32,
                                         32, "none", Band(0), PLAIN)
    assert mask == "document" and mods.score_mod == "none"
    assert mods.mask_ranges is ranges and mods.variant_tensors == (doc_ids,)
    with pytest.raises(ValueError, match="own mask_mod"):
        variant_args.prepare("document", {"doc_ids": doc_ids}, block_mask, q, q, 2, 32, 32,
                             "causal", Band(0), PLAIN)


def test_a_per_head_block_mask_must_have_the_calls_heads():
    """head_window's mask_mod reads h: its block mask holds one per query head."""
    from flashgen import variant_args, variants
    from flashgen.band import Band
    from flashgen.modifiers import PLAIN

    q = torch.randn(2, 32, 4, 64, dtype=torch.bfloat16)
    window = torch.tensor([-1, 8, 8, 0], dtype=torch.int32)
    head_window = variants.resolve("head_window")
    for heads, fits in ((4, True), (2, False), (1, False)):
        ranges = torch.zeros(variants.block_mask_shape(head_window, 2, heads, 32, 32),
                             dtype=torch.int32)
        block_mask = variant_args.BlockMask("head_window", ranges, 2, 32, 32)
        call = ("head_window", {"window": window}, block_mask, q, q, 2, 32, 32, "none", Band(0),
                PLAIN)
        if fits:
            assert variant_args.prepare(*call)[2].mask_ranges is ranges
        else:
            with pytest.raises(ValueError, match=rf"built for .* \('head_window', 2, {heads}, "
                                                 rf"32, 32\), this call is \('head_window', 2, "
                                                 rf"4, 32, 32\)"):
                variant_args.prepare(*call)


def test_a_decode_variant_call_is_checked_before_any_kernel():
    from flashgen import variant_args
    from flashgen.dispatch import DispatchError
    from flashgen.modifiers import PLAIN, Modifiers

    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    k_cache = torch.randn(2, 128, 4, 64, dtype=torch.bfloat16)
    ids = torch.zeros(2, 128, dtype=torch.int32)
    name, tensors = variant_args.prepare_decode("document", {"doc_ids": ids}, q, k_cache, 2, 1, 128,
                                                "none", PLAIN)
    assert name == "document" and tensors[0].shape == (2, 128)
    with pytest.raises(DispatchError, match=r"'prefix_lm' has no KV-cache kernels"):
        variant_args.prepare_decode("prefix_lm", {"prefix_len": ids[:, 0]}, q, k_cache, 2, 1, 128,
                                    "none", PLAIN)
    with pytest.raises(ValueError, match="own mask_mod; pass causal=False"):
        variant_args.prepare_decode("document", {"doc_ids": ids}, q, k_cache, 2, 1, 128, "causal",
                                    PLAIN)
    with pytest.raises(ValueError, match=r"seqlen_k\] = \(2, 128\)"):
        variant_args.prepare_decode("document", {"doc_ids": ids[:, :5]}, q, k_cache, 2, 1, 128,
                                    "none", PLAIN)
    with pytest.raises(NotImplementedError, match="own score_mod"):
        variant_args.prepare_decode("relative_bias", {"bias": torch.zeros(4, 255)}, q, k_cache,
                                    2, 1, 128, "none", Modifiers(softcap=5.0))
