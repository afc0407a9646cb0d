"""flashgen.compat's private FlashAttention-2 functions, which ring attention and FA2's own tests
call: the same kernels as flashgen's public functions, FA2's returns and in-place gradients."""

import math

import pytest
import torch

import flashgen
from flashgen.compat import flash_attn_interface as fa2

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tensors(*shapes, dtype=torch.bfloat16):
    return [torch.randn(*shape, device="cuda").to(dtype).requires_grad_() for shape in shapes]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 59])
def test_private_forward_and_backward_are_the_public_functions(head_dim, causal,
                                                               poisoned_allocations):
    q, k, v = tensors((2, 100, 4, head_dim), (2, 150, 2, head_dim), (2, 150, 2, head_dim))
    out, lse, _ = flashgen.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    out2, lse2, s_dmask, rng_state = fa2._flash_attn_forward(
        q, k, v, 0.0, q.shape[-1] ** -0.5, causal, -1, -1, 0.0, None, False)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    assert s_dmask is None and rng_state.numel() == 0 and not out2.requires_grad
    buffers = [torch.empty_like(t) for t in (q, k, v)]
    softmax_d = fa2._flash_attn_backward(dout, q, k, v, out2, lse2, *buffers, 0.0,
                                         q.shape[-1] ** -0.5, causal, -1, -1, 0.0, None, False,
                                         rng_state)
    for name, buffer, grad in zip(("dq", "dk", "dv"), buffers, grads):
        assert torch.equal(buffer, grad), name
    expected_d = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(softmax_d, expected_d)


def test_varlen_private_functions_and_fa2s_lse_for_rows_without_keys(poisoned_allocations):
    lengths_q, lengths_k = [30, 7, 50], [40, 0, 64]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                               device="cuda") for n in (lengths_q, lengths_k))
    q, k, v = tensors((87, 4, 128), (104, 2, 128), (104, 2, 128))
    out, lse, _ = flashgen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 64, causal=True,
                                                  return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    out2, lse2, _, rng_state = fa2._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 50, 64, 0.0,
                                                              128 ** -0.5, True)
    assert torch.equal(out2, out)
    empty_rows = slice(30, 37)  # the sequence without keys
    assert torch.isneginf(lse[:, empty_rows]).all()  # flashgen's own semantic
    assert (lse2[:, empty_rows] == math.inf).all()  # FA2's
    assert torch.equal(lse2[:, :30], lse[:, :30])
    buffers = [torch.empty_like(t) for t in (q, k, v)]
    fa2._flash_attn_varlen_backward(dout, q, k, v, out2, lse2, *buffers, cu_q, cu_k, 50, 64, 0.0,
                                    128 ** -0.5, True, -1, -1, 0.0, None, False, rng_state)
    for name, buffer, grad in zip(("dq", "dk", "dv"), buffers, grads):
        assert torch.equal(buffer, grad), name
    with pytest.raises(RuntimeError, match="num_splits > 1 is not supported"):
        fa2._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 50, 64, 0.0, 128 ** -0.5, True,
                                       num_splits=2)


def test_the_backward_regenerates_the_forwards_dropout_from_rng_state(poisoned_allocations):
    q, k, v = tensors((2, 200, 4, 128), (2, 200, 4, 128), (2, 200, 4, 128))
    torch.manual_seed(7)
    out = flashgen.flash_attn_func(q, k, v, dropout_p=0.2, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.manual_seed(7)  # the same draw: the same key
    out2, lse2, _, rng_state = fa2._flash_attn_forward(q, k, v, 0.2, 128 ** -0.5, True, -1, -1,
                                                       0.0, None, False)
    assert torch.equal(out2, out) and rng_state.dtype == torch.int64
    torch.manual_seed(8)  # the backward must not draw a new one
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    fa2._flash_attn_backward(dout, q, k, v, out2, lse2, dq, dk, dv, 0.2, 128 ** -0.5, True, -1,
                             -1, 0.0, None, False, rng_state)
    for name, ours, theirs in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert torch.equal(ours, theirs), name


def test_the_raw_entry_points_refuse_a_generator():
    q, k, v = (t.detach() for t in tensors((1, 8, 2, 64), (1, 8, 2, 64), (1, 8, 2, 64)))
    with pytest.raises(RuntimeError, match="generator` argument is no longer supported"):
        fa2.flash_attn_gpu.fwd(q, k, v, None, None, 0.0, 0.125, True, -1, -1, 0.0, False,
                               torch.empty(1, device="cuda"))
    out, lse, _, rng_state = fa2.flash_attn_gpu.fwd(q, k, v, torch.empty_like(q), None, 0.0,
                                                    0.125, True, -1, -1, 0.0, False, None)
    dq, dk, dv, _ = fa2.flash_attn_gpu.bwd(q, q, k, v, out, lse, None, None, None, None, 0.0,
                                           0.125, True, -1, -1, 0.0, False, None, rng_state)
    assert dq.shape == q.shape and not dq.isnan().any()


@pytest.mark.parametrize("variant", ["zigzag_ring_flash_attn_func", "ring_flash_attn_func"])
def test_ring_flash_attn_at_world_size_1_is_flash_attn_func(variant):
    """ring-flash-attn (PyPI ring-flash-attn, its functions unmodified) over flashgen.compat in one
    process: its block loop and out/lse merge on flashgen's private functions give what
    flash_attn_func gives, output and gradients."""
    import torch.distributed as dist

    from flashgen import compat

    try:
        compat.install()
    except RuntimeError as error:  # another flash_attn is imported in this process
        pytest.skip(str(error))
    ring = pytest.importorskip("ring_flash_attn", reason="pip install ring-flash-attn")
    q, k, v = tensors(*[(2, 512, 8, 128)] * 3)
    dout = torch.randn_like(q)
    out = flashgen.flash_attn_func(q, k, v, causal=True)
    expected = (out, *torch.autograd.grad(out, (q, k, v), dout))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        out = getattr(ring, variant)(q, k, v, causal=True)
        got = (out, *torch.autograd.grad(out, (q, k, v), dout))
    finally:
        dist.destroy_process_group()
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=name)
