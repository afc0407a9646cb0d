"""flashgen as PyTorch's flash attention (flashgen.integrations.sdpa): SDPA's FLASH_ATTENTION
backend and aten's flash ops run flashgen's kernels and give flashgen's results, eager, under
torch.compile(fullgraph=True), with autograd and with dropout; restoring puts torch's kernels
back; torch's context parallel at world size 1 matches a plain call."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
if not hasattr(torch.nn.attention, "register_flash_attention_impl"):
    pytest.skip("this torch has no flash-attention registry", allow_module_level=True)

from flashgen.integrations import sdpa  # noqa: E402


@pytest.fixture
def flashgen_active():
    with sdpa.enable(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        yield


def bhsd(batch, heads, seqlen, head_dim, requires_grad=False):
    """(batch, heads, seq, dim) bf16, as a projection's transposed view gives it."""
    t = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    return t.transpose(1, 2).requires_grad_(requires_grad)


def flashgen_kernels(function):
    """function()'s result and the names of the flashgen kernels the profiler saw it run."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        result = function()
        torch.cuda.synchronize()
    return result, [e.name for e in profile.events() if "flashgen" in e.name]


@contextlib.contextmanager
def torchs_kernels():
    """torch's own flash attention for the block, flashgen's again after it."""
    torch.nn.attention.restore_flash_attention_impl()
    try:
        yield
    finally:
        torch.nn.attention.activate_flash_attention_impl("flashgen")


def reference_and_torchs(q, k, v, is_causal, dout):
    """(out, dq, dk, dv) in (batch, heads, seq, dim) of the fp32 reference (causal
    bottom-right) and of torch's own flash attention."""
    results = []
    for run in ("reference", "torch"):
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        if run == "reference":
            out = attention_ref(*(t.transpose(1, 2) for t in inputs), causal=is_causal)[0]
            out = out.transpose(1, 2)
            results.append((out, *torch.autograd.grad(out, inputs, dout)))
        else:
            with torchs_kernels():
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    *inputs, is_causal=is_causal)[0]
                results.append((out, *torch.autograd.grad(out, inputs, dout)))
    return results


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sdpa_runs_flashgen_forward_and_backward(flashgen_active, head_dim, is_causal):
    q, k, v = (bhsd(2, 8, 1000, head_dim, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return out, *torch.autograd.grad(out, (q, k, v), dout)

    (out, *grads), kernels = flashgen_kernels(run)
    assert kernels, "no flashgen kernel ran"
    expected = flashgen.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=is_causal)
    assert torch.equal(out, expected.transpose(1, 2))
    (reference, *reference_grads), (torchs, *torchs_grads) = reference_and_torchs(
        q, k, v, is_causal, dout)
    assert_close_fa2(out, reference, torchs)
    for name, grad, reference_grad, torchs_grad in zip("qkv", grads, reference_grads,
                                                       torchs_grads):
        assert_close_fa2(grad, reference_grad, torchs_grad, f"d{name}", eps=GRADIENT_EPS)
    print(f"\nhead dim {head_dim}, causal {is_causal}: {sorted(set(kernels))}")


def test_the_op_takes_gqa_and_aligns_causal_bottom_right_as_torchs(flashgen_active):
    # torch's causal_lower_right sends non-square causal calls to this op
    q, k, v = bhsd(1, 8, 100, 64), bhsd(1, 2, 300, 64), bhsd(1, 2, 300, 64)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)[:2]
    expected, expected_lse = flashgen.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)),
                                                      causal=True, return_attn_probs=True)[:2]
    assert torch.equal(out, expected.transpose(1, 2)) and torch.equal(lse, expected_lse)
    inputs = [t.transpose(1, 2) for t in (q, k, v)]
    reference = attention_ref(*inputs, causal=True)[0]
    in_bf16 = attention_ref(*inputs, causal=True, upcast=False)[0]  # PyTorch's own error
    assert_close_fa2(out, reference.transpose(1, 2), in_bf16.transpose(1, 2))


def test_varlen_op_gives_flash_attn_varlen_funcs_results(flashgen_active):
    lengths = [100, 37, 250]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                              dtype=torch.int32)
    q, k, v = (torch.randn(sum(lengths), heads, 128, device="cuda", dtype=torch.bfloat16)
               for heads in (8, 2, 2))
    out, lse = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), 0.0, True, False,
        window_size_left=64, window_size_right=0)[:2]
    expected, expected_lse, _ = flashgen.flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True,
        window_size=(64, 0), return_attn_probs=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_dropout_runs_flashgens_and_its_backward_regenerates_the_mask(flashgen_active):
    q, k, v = (bhsd(2, 4, 512, 64, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    results = []
    for run in ("through SDPA", "flashgen's own"):
        torch.manual_seed(7)  # the same key: both draw it from torch's CUDA generator
        if run == "through SDPA":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        else:
            out = flashgen.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)),
                                           dropout_p=0.2, causal=True).transpose(1, 2)
        results.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
    undropped = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (out, *grads), (expected, *expected_grads) = results
    assert torch.equal(out, expected) and not torch.equal(out, undropped)
    for name, grad, expected_grad in zip("qkv", grads, expected_grads):
        # the backward adds dq up in an order that varies: its last bits may differ
        torch.testing.assert_close(grad, expected_grad, msg=f"d{name}")


def test_compiled_fullgraph_runs_flashgen_forward_and_backward(flashgen_active):
    q, k, v = (bhsd(2, 8, 512, 128, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(attention, fullgraph=True)
    compiled(q, k, v)  # compiles outside the profile

    def run(function):
        out = function(q, k, v)
        return out, *torch.autograd.grad(out, (q, k, v), dout)

    (out, *grads), kernels = flashgen_kernels(lambda: run(compiled))
    assert any("bwd" in name for name in kernels), kernels
    eager_out, *eager_grads = run(attention)
    assert torch.equal(out, eager_out)
    for name, grad, eager_grad in zip("qkv", grads, eager_grads):
        torch.testing.assert_close(grad, eager_grad, msg=f"d{name}")


def test_restoring_puts_torchs_kernels_back():
    q, k, v = (bhsd(1, 8, 256, 64) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with sdpa.enable():
            _, inside = flashgen_kernels(lambda: F.scaled_dot_product_attention(q, k, v))
        assert torch.nn.attention.current_flash_attention_impl() is None
        _, after = flashgen_kernels(lambda: F.scaled_dot_product_attention(q, k, v))
    assert inside and not after


def test_context_parallel_at_world_size_1_matches_a_plain_call(flashgen_active,
                                                              launched_kernels):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    q, k, v = (bhsd(2, 8, 512, 64, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out, *torch.autograd.grad(out, (q, k, v), dout)

    plain = run()
    launched_kernels.clear()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        # the buffers are sharded along the sequence in place; at world size 1 they stay whole
        sequence = torch.arange(512, device="cuda")[None]
        with context_parallel(init_device_mesh("cuda", (1,)), buffers=[sequence],
                              buffer_seq_dims=[1]):
            parallel = run()
    finally:
        dist.destroy_process_group()
    assert any(n.startswith("fwd_") for n in launched_kernels), launched_kernels
    assert any(n.startswith("bwd_") for n in launched_kernels), launched_kernels
    for name, result, expected in zip(("out", "dq", "dk", "dv"), parallel, plain):
        torch.testing.assert_close(result, expected, msg=name)


def test_lse_of_a_row_without_keys_is_minus_infinity(flashgen_active):
    q, k, v = bhsd(1, 2, 8, 64), bhsd(1, 2, 4, 64), bhsd(1, 2, 4, 64)
    # bottom-right causal with more queries than keys: the first 4 rows see no key
    lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)[1]
    assert torch.all(lse[..., :4] == -math.inf) and torch.isfinite(lse[..., 4:]).all()
