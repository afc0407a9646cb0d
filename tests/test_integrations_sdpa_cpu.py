"""flashgen.integrations.sdpa on a CPU: the registration with torch's flash-attention registry,
and the aten ops' arguments as flashgen's kernels get them (tests/kernel_mock.py), or torch's own
kernel where flashgen has none."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.nn.attention, "register_flash_attention_impl"):
    pytest.skip("this torch has no flash-attention registry", allow_module_level=True)

from codegen import params  # noqa: E402
from flashgen import validate  # noqa: E402
from flashgen.integrations import sdpa  # noqa: E402
from tests import kernel_mock  # noqa: E402

OPS = [op for op in sdpa._KERNELS if hasattr(torch.ops.aten, op)]


def flashgen_runs(op: str) -> bool:
    """Whether the op's CUDA kernel is flashgen's."""
    return "flashgen/integrations/sdpa.py" in torch._C._dispatch_dump(f"aten::{op}")


def test_importing_registers_flashgen_with_torch():
    assert "flashgen" in torch.nn.attention.list_flash_attention_impls()


def test_enable_overrides_every_op_and_puts_the_previous_implementation_back():
    assert torch.nn.attention.current_flash_attention_impl() is None
    with sdpa.enable():
        assert torch.nn.attention.current_flash_attention_impl() == "flashgen"
        assert all(flashgen_runs(op) for op in OPS)
    assert torch.nn.attention.current_flash_attention_impl() is None
    assert not any(flashgen_runs(op) for op in OPS)

    torch.nn.attention.activate_flash_attention_impl("flashgen")
    assert all(flashgen_runs(op) for op in OPS)
    torch.nn.attention.restore_flash_attention_impl()
    assert not any(flashgen_runs(op) for op in OPS)


@pytest.fixture
def mocked(monkeypatch):
    """kernel_mock on an sm_80, with the kernel check's answers forgotten before and after."""
    record = kernel_mock.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    sdpa._has_kernels.cache_clear()
    yield record
    sdpa._has_kernels.cache_clear()


def launched(record, entry: str):
    args_type = params.FwdArgs if entry == "fwd" else params.BwdArgs
    (args,) = [args for e, args in record.launches if e == entry]
    return args_type._make(args[2:])  # after the launcher's address and error string's


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


class TorchKernel:
    """Stands in for torch's own CUDA kernel: records its calls."""

    def __init__(self):
        self.calls = []

    def call_boxed(self, keyset, *args, **options):
        self.calls.append((args, options))
        return "torch's result"


@pytest.mark.parametrize("layout", ["heads_first", "seq_first"])
def test_sdpa_op_runs_flashgen_bottom_right_with_gqa_in_the_layouts_its_meta_kernel_gives(
        mocked, layout):
    def bhsd(batch, heads, seq, dim):  # SDPA's shape, in either memory layout
        if layout == "heads_first":
            return bf16(batch, heads, seq, dim)
        return bf16(batch, seq, heads, dim).transpose(1, 2)

    q, k, v = bhsd(2, 4, 5, 64), bhsd(2, 2, 9, 64), bhsd(2, 2, 9, 64)
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, debug = \
        sdpa._scaled_dot_product_flash_attention(None, None, q, k, v, 0.0, True, False,
                                                 scale=0.25)
    args = launched(mocked, "fwd")
    assert mocked.fwd_plans[0]["mask"] == "causal"
    assert (args.mask_offset, args.softmax_scale) == (9 - 5, 0.25)  # bottom-right, as torch's
    assert (args.heads, args.heads_kv, args.seqlen_q, args.seqlen_k) == (4, 2, 5, 9)
    assert out.shape == q.shape and out.stride() == torch.empty_like(q).stride()
    assert lse.shape == (2, 4, 5) and lse.dtype == torch.float32
    assert (cum_q, cum_k, max_q, max_k) == (None, None, 5, 9)
    assert rng_state.shape == (2,) and rng_state.dtype == torch.uint64
    assert unused.shape == () and unused.dtype == torch.uint64 and debug.numel() == 0

    grads = sdpa._scaled_dot_product_flash_attention_backward(
        None, None, torch.randn_like(out), q, k, v, out, lse, None, None, 5, 9, 0.0, True,
        rng_state, unused, scale=0.25)
    assert launched(mocked, "bwd").mask_offset == 4
    for grad, t in zip(grads, (q, k, v)):
        assert grad.shape == t.shape and grad.stride() == torch.empty_like(t).stride()


def test_varlen_forward_takes_the_window_and_returns_lse_per_head_and_row(mocked):
    q, k, v = bf16(7, 4, 64), bf16(7, 2, 64), bf16(7, 2, 64)
    cu_seqlens = torch.tensor([0, 3, 7], dtype=torch.int32)
    out, lse, *_ = sdpa._flash_attention_forward(
        None, None, q, k, v, cu_seqlens, cu_seqlens, 4, 4, 0.0, False, False,
        window_size_left=2, window_size_right=0, num_splits=3)
    args = launched(mocked, "fwd")
    assert mocked.fwd_plans[0]["mask"] == "window" and mocked.fwd_plans[0]["reads"] == "varlen"
    assert (args.window_left, args.window_right) == (2, 0)
    assert (args.batch, args.cu_seqlens_q) == (2, cu_seqlens.data_ptr())
    assert out.shape == (7, 4, 64) and lse.shape == (4, 7)


def test_the_backward_regenerates_the_forwards_dropout_from_rng_state(mocked, monkeypatch):
    drawn = torch.tensor([2**62 + 7], dtype=torch.int64)
    monkeypatch.setattr(validate, "draw_dropout_seed", lambda device: drawn)  # on a CPU
    q, k, v = bf16(1, 16, 4, 64), bf16(1, 16, 4, 64), bf16(1, 16, 4, 64)
    out, lse, rng_state, unused, _ = sdpa._flash_attention_forward(
        None, None, q, k, v, None, None, 16, 16, 0.1, True, False)
    forward = launched(mocked, "fwd")
    assert forward.dropout_seed == drawn.data_ptr() and forward.dropout_p == pytest.approx(0.1)
    assert rng_state.view(torch.int64).tolist() == [2**62 + 7, 0]

    sdpa._flash_attention_backward(None, None, torch.randn_like(out), q, k, v, out, lse, None,
                                   None, 16, 16, 0.1, True, rng_state, unused)
    backward = launched(mocked, "bwd")
    assert backward.dropout_seed == rng_state.data_ptr()  # the key's bits, read in place
    assert backward.dropout_p == pytest.approx(0.1)


def test_a_head_dim_flashgen_has_no_kernels_for_runs_torchs_kernel_with_the_same_arguments(
        mocked):
    q = bf16(1, 8, 2, 512)  # larger than any configured head dim
    torch_kernel = TorchKernel()
    result = sdpa._flash_attention_forward(torch_kernel, "keyset", q, q, q, None, None, 8, 8,
                                           0.0, True, False, scale=0.5)
    assert result == "torch's result" and not mocked.launches
    ((args, options),) = torch_kernel.calls
    assert args[:3] == (q, q, q) and args[3:] == (None, None, 8, 8, 0.0, True, False)
    assert options == {"scale": 0.5}
    with pytest.raises(NotImplementedError, match="no kernel of its own"):
        sdpa._flash_attention_forward(None, "keyset", q, q, q, None, None, 8, 8, 0.0, True,
                                      False)


def test_what_flashgen_does_not_return_runs_torchs_kernel_but_not_with_dropout(mocked):
    q = bf16(1, 8, 2, 64)
    torch_kernel = TorchKernel()
    assert sdpa._scaled_dot_product_flash_attention(torch_kernel, None, q, q, q, 0.0, False,
                                                    True) == "torch's result"
    assert sdpa._flash_attention_forward(torch_kernel, None, q, q, q, None, None, 8, 8, 0.0,
                                         False, False,
                                         seqused_k=torch.ones(1, dtype=torch.int32)
                                         ) == "torch's result"
    assert not mocked.launches
    with pytest.raises(NotImplementedError, match="return_debug_mask and dropout_p > 0"):
        sdpa._scaled_dot_product_flash_attention(torch_kernel, None, q, q, q, 0.1, False, True)


def test_an_arch_without_configured_kernels_has_none():
    has_kernels = sdpa._has_kernels.__wrapped__  # uncached
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
        assert not has_kernels(0, "bf16", 64, "causal", "none", False, False)
        patch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        assert has_kernels(0, "bf16", 64, "causal", "none", False, False)
        assert has_kernels(0, "bf16", 72, "causal", "none", True, True)
        assert not has_kernels(0, "bf16", 512, "causal", "none", False, False)
