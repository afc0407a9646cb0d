"""The e4m3 forward's host side (flashgen/fp8.py) on a CPU: V^T's layout, the kernels' key order
checked against CuTe's register layouts, the arguments it refuses and the params it launches."""

from __future__ import annotations

import itertools
import subprocess

import pytest

torch = pytest.importorskip("torch")

from codegen import params, paths  # noqa: E402
from flashgen import flash_attn_func, fp8, loader  # noqa: E402
from tests import kernel_mock  # noqa: E402

E4M3 = torch.float8_e4m3fn


def e4m3(*shape):
    return (torch.randn(*shape) * 4).to(E4M3)


@pytest.mark.parametrize("seqlen_k", [37, 64])
def test_v_transposed_holds_each_slots_key_and_zeros_past_the_keys(seqlen_k):
    v = e4m3(2, seqlen_k, 3, 64)
    vt = fp8.transposed_v(v)
    keys = -(-seqlen_k // 16) * 16
    assert vt.shape == (2, 3, 64, keys) and vt.is_contiguous()
    for slot in range(keys):
        key = fp8.key_of_slot(slot)
        if key < seqlen_k:
            assert torch.equal(vt[..., slot].view(torch.uint8),
                               v[:, key].view(torch.uint8)), slot
        else:
            assert not vt[..., slot].view(torch.uint8).any()


def test_key_of_slot_permutes_each_group_of_16():
    for group in range(3):
        slots = range(16 * group, 16 * group + 16)
        assert sorted(fp8.key_of_slot(s) for s in slots) == list(slots)


@pytest.mark.nvcc
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc is not installed")
def test_the_kernels_key_order_is_pythons_and_matches_cutes_register_layouts(tmp_path):
    """fragments.cuh's check (which the e4m3 traits static_assert) holds for the 8-bit wgmmas'
    layouts and fails for the 16-bit ones, whose A operand is laid out otherwise; its key order
    is key_of_slot's."""
    source = tmp_path / "check.cu"
    source.write_text('''#include <cstdio>
#include "flashgen/hopper/fwd_traits.cuh"
template <class Element> using Traits = flashgen::hopper::FwdTraits<
    128, 128, 128, 2, Element, true, true, cutlass::bfloat16_t>;
using Fp8 = Traits<cutlass::float_e4m3_t>;
using Bf16 = Traits<cutlass::bfloat16_t>;
int main() {
  std::printf("%d %d\\n", int(flashgen::hopper::fp8_p_from_own_scores<Fp8::OpS, Fp8::OpO>()),
              int(flashgen::hopper::fp8_p_from_own_scores<Bf16::OpS, Bf16::OpO>()));
  for (int s = 0; s < 32; ++s) std::printf("%d ", flashgen::hopper::fp8_key_of_slot(s));
}
''')
    binary = tmp_path / "check"
    subprocess.run([str(paths.nvcc_path()), "-std=c++17", "--expt-relaxed-constexpr",
                    f"-I{paths.INCLUDE_DIR}", f"-I{paths.cutlass_include_dir()}", str(source),
                    "-o", str(binary)], check=True, capture_output=True)
    checks, keys = subprocess.run([str(binary)], check=True, capture_output=True,
                                  text=True).stdout.splitlines()
    assert checks == "1 0"
    assert [int(k) for k in keys.split()] == [fp8.key_of_slot(s) for s in range(32)]


# --- the arguments ---------------------------------------------------------------------------

@pytest.fixture
def record(monkeypatch):
    """flashgen's call path on a CPU (tests/kernel_mock.py) on an H100-like GPU, the e4m3
    kernels' launchers recording."""
    recorded = kernel_mock.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(loader, "launcher", lambda spec: loader.Launcher(spec, 0, 0, None))
    return recorded


def qkv(batch=2, seqlen_q=40, seqlen_k=56, heads=4, heads_kv=2, dim=128):
    return (e4m3(batch, seqlen_q, heads, dim), e4m3(batch, seqlen_k, heads_kv, dim),
            e4m3(batch, seqlen_k, heads_kv, dim))


def launched(record) -> dict:
    ((entry, args),) = record.launches
    assert entry == "fwd"
    return dict(zip(params.FwdArgs._fields, args[2:]))


def test_an_e4m3_call_launches_on_v_transposed_with_its_descales(record):
    q, k, v = qkv()
    q_descale = torch.rand(2, 2)
    k_descale = torch.rand(1, 1)  # broadcast: one factor for every (batch, KV head)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, q_descale=q_descale,
                                  k_descale=k_descale, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 40, 4, 128)
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 40)
    fields = launched(record)
    keys = 64  # 56 padded to a whole group of 16
    assert (fields["v_batch_stride"], fields["v_row_stride"], fields["v_head_stride"]) == (
        2 * 128 * keys, keys, 128 * keys)
    assert fields["q"] == q.data_ptr() and fields["k"] == k.data_ptr()
    assert (fields["q_descale"], fields["q_descale_batch_stride"],
            fields["q_descale_head_stride"]) == (q_descale.data_ptr(), 2, 1)
    assert (fields["k_descale"], fields["k_descale_batch_stride"],
            fields["k_descale_head_stride"]) == (k_descale.data_ptr(), 0, 0)
    assert fields["v_descale"] == 0  # none: 1
    assert fields["mask_offset"] == 16 and fields["softmax_scale"] == pytest.approx(128 ** -0.5)
    assert record.launches and fields["o"] == out.data_ptr()


def test_out_dtype_float16_runs_the_fp16_output_kernel(record, monkeypatch):
    specs = []
    monkeypatch.setattr(loader, "launcher",
                        lambda spec: specs.append(spec) or loader.Launcher(spec, 0, 0, None))
    out = flash_attn_func(*qkv(dim=64), out_dtype=torch.float16)
    assert out.dtype == torch.float16
    (spec,) = specs
    assert (spec.kind, spec.dtype, spec.head_dim, spec.mask) == ("fwd_fp8", "fp16", 64, "none")


def test_a_head_dim_without_kernels_runs_zero_padded(record):
    q, k, v = qkv(dim=96)
    out = flash_attn_func(q, k, v)
    assert out.shape == (2, 40, 4, 96)
    fields = launched(record)
    assert fields["q_row_stride"] == 4 * 128 and fields["o"] != out.data_ptr()


def test_no_key_gives_zero_output_and_lse_minus_infinity(record):
    q, k, v = qkv(seqlen_k=0)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert not record.launches
    assert not out.float().any() and torch.isneginf(lse).all()


@pytest.mark.parametrize("change, error, match", [
    (lambda q, k, v: (q, k.to(torch.float8_e5m2), v), TypeError, "k is torch.float8_e5m2.*"
                                                                  "float8_e4m3fn only"),
    (lambda q, k, v: (q, k.float().to(torch.bfloat16), v), TypeError,
     "got k in torch.bfloat16"),
    (lambda q, k, v: (q, k[:, :, :1], v), ValueError, "same shape"),
], ids=["e5m2", "bf16_k", "k_and_v_differ"])
def test_mixed_or_unbuilt_inputs_name_the_argument(record, change, error, match):
    with pytest.raises(error, match=match):
        flash_attn_func(*change(*qkv()))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(q_descale=torch.rand(2, 3)), ValueError, r"q_descale must be \(batch, nheads_k\) = "
                                                    r"\(2, 2\)"),
    (dict(v_descale=torch.rand(2, 2, dtype=torch.float64)), TypeError,
     "v_descale must be torch.float32"),
    (dict(k_descale=[1.0]), TypeError, "k_descale must be a torch.Tensor"),
    (dict(out_dtype=torch.float32), TypeError, "out_dtype=torch.float32"),
    (dict(softcap=30.0), NotImplementedError, "does not take softcap=30.0"),
    (dict(dropout_p=0.1), NotImplementedError, "does not take dropout_p=0.1"),
], ids=["descale_shape", "descale_dtype", "descale_type", "out_dtype", "softcap", "dropout"])
def test_bad_arguments_say_what_is_wrong(record, kwargs, error, match):
    with pytest.raises(error, match=match):
        flash_attn_func(*qkv(), **kwargs)
    assert not record.launches


def test_descales_with_16_bit_inputs_are_refused(record):
    q, k, v = (torch.randn(1, 8, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(TypeError, match="takes q, k and v in torch.float8_e4m3fn, got q in "
                                        "torch.bfloat16"):
        flash_attn_func(q, k, v, q_descale=torch.ones(1, 2))


def test_an_e4m3_call_that_wants_a_gradient_is_refused(record):
    q, k, v = qkv()
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="no backward"):
        flash_attn_func(q, k, v)
    with torch.no_grad():
        flash_attn_func(q, k, v)
    assert record.launches


def test_a_gpu_without_fp8_tensor_cores_is_refused(record, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(RuntimeError, match="no FP8 tensor cores"):
        flash_attn_func(*qkv())


def test_a_packed_e4m3_batch_launches_on_its_sequences_and_v_transposed_per_sequence(record):
    from flashgen import flash_attn_varlen_func

    lengths_q, lengths_k = [5, 30, 1], [7, 40, 20]
    q = e4m3(sum(lengths_q), 4, 64)
    k, v = e4m3(sum(lengths_k), 2, 64), e4m3(sum(lengths_k), 2, 64)
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 40, causal=True,
                                      v_descale=torch.rand(3, 2), return_softmax_lse=True)
    assert out.shape == (36, 4, 64) and out.dtype == torch.bfloat16 and lse.shape == (4, 36)
    fields = launched(record)
    columns = 80 + 16 * 3  # 67 keys rounded up to 16, and 16 per sequence
    assert (fields["v_row_stride"], fields["v_head_stride"]) == (columns, 64 * columns)
    assert (fields["cu_seqlens_q"], fields["cu_seqlens_k"]) == (cu_q.data_ptr(), cu_k.data_ptr())
    assert (fields["batch"], fields["seqlen_q"], fields["seqlen_k"]) == (3, 30, 40)
    assert fields["v_descale_batch_stride"] == 2 and fields["q_descale"] == 0


def test_v_transposed_per_sequence_holds_each_sequences_keys_from_its_own_column():
    lengths = [5, 20, 16, 0, 33]
    v = e4m3(sum(lengths), 2, 32)
    cu = cumulative(lengths)
    vt = fp8.transposed_v_packed(v, cu)
    assert vt.shape == (1, 2, 32, 80 + 16 * 5) and vt.is_contiguous()
    kept = torch.zeros(vt.shape[-1], dtype=torch.bool)
    for b, length in enumerate(lengths):
        first = (int(cu[b]) + 15) // 16 * 16 + 16 * b
        for slot in range(-(-length // 16) * 16):
            key = fp8.key_of_slot(slot)
            if key < length:
                kept[first + slot] = True
                assert torch.equal(vt[0, :, :, first + slot].view(torch.uint8),
                                   v[int(cu[b]) + key].view(torch.uint8))
    assert not vt[0, :, :, ~kept].view(torch.uint8).any()  # zeros elsewhere


def test_packed_e4m3_arguments_it_does_not_take_are_refused(record):
    from flashgen import flash_attn_varlen_func

    q, k, v = (t[0] for t in qkv())
    cu = cumulative(40)
    with pytest.raises(NotImplementedError, match="does not take seqused_k"):
        flash_attn_varlen_func(q, k[:40], v[:40], cu, cu, 40, 40,
                               seqused_k=torch.tensor([30], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q .* must have the same length"):
        flash_attn_varlen_func(q, k[:40], v[:40], cu, cumulative(20, 20), 40, 40)


def test_a_kv_cache_in_e4m3_says_where_8_bit_inputs_run(record):
    from flashgen import flash_attn_with_kvcache

    q = e4m3(1, 1, 4, 64)
    cache = e4m3(1, 64, 2, 64)
    with pytest.raises(TypeError, match="run in flash_attn_func and flash_attn_varlen_func"):
        flash_attn_with_kvcache(q, cache, cache)


def cumulative(*lengths):
    if len(lengths) == 1 and isinstance(lengths[0], list):
        lengths = lengths[0]
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
