"""flashgen's torch ops without a GPU: registration, the fake (meta) implementations, how the
public functions call the op (arguments, autocast, torch.compile tracing), and the autograd
wiring, run on CPU tensors with the kernels replaced by the fp32 reference."""

from __future__ import annotations

import inspect
import math

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from codegen.params import WINDOW_UNBOUNDED as UNBOUNDED  # noqa: E402
from flashgen import (backward, flash_attn_func, flash_attn_with_kvcache, forward,  # noqa: E402
                      host, ops, scaled_dot_product_attention)
from flashgen.band import Band  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402

FWD = torch.ops.flashgen.fwd.default
BWD = torch.ops.flashgen.bwd.default
# The ops' arguments after alibi_slopes in a call without them: attn_bias, sinks, the variant's
# name, its four tensor slots, mask ranges, dropout_p and dropout_seed.
NO_EXTRAS = (None, None, "", None, None, None, None, None, 0.0, None)
# forward.forward's cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q and max_seqlen_k for equal
# lengths (backward.backward takes all but seqused_k).
NO_LAYOUT = (None, None, None, 0, 0)
# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
SHAPES = [(2, 17, 33, 8, 2, 64), (1, 1, 1, 4, 4, 32), (3, 40, 9, 6, 1, 128), (2, 0, 5, 2, 2, 64)]


def shape_id(shape):
    return "b{}_q{}_k{}_h{}_hk{}_d{}".format(*shape)


def make_qkv(shape, dtype=torch.bfloat16, device="cpu", requires_grad=False):
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim = shape
    return [torch.randn(size, dtype=dtype, device=device, requires_grad=requires_grad)
            for size in ((batch, seqlen_q, heads, head_dim), (batch, seqlen_k, heads_kv, head_dim),
                         (batch, seqlen_k, heads_kv, head_dim))]


def expected_strides(shape, heads_first):
    """The layouts the brief of the ops promises, computed independently of flashgen."""
    batch, seq, heads, dim = shape
    if heads_first:
        return torch.empty(batch, heads, seq, dim).transpose(1, 2).stride()
    return torch.empty(batch, seq, heads, dim).stride()


# --- registration ---------------------------------------------------------------------------

def test_ops_are_registered_with_their_schemas_and_tags():
    assert str(FWD._schema) == (
        "flashgen::fwd(Tensor q, Tensor k, Tensor v, float scale, str mask, SymInt mask_offset, "
        "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
        "Tensor? attn_bias, Tensor? sinks, str variant, Tensor? variant_tensor0, "
        "Tensor? variant_tensor1, "
        "Tensor? variant_tensor2, Tensor? variant_tensor3, Tensor? mask_ranges, "
        "float dropout_p, Tensor? dropout_seed, "
        "bool deterministic, bool heads_first, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
        "Tensor? seqused_k=None, SymInt max_seqlen_q=0, "
        "SymInt max_seqlen_k=0) -> (Tensor out, Tensor lse)")
    assert str(BWD._schema) == (
        "flashgen::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "bool attn_bias_grad, "
        "float scale, str mask, SymInt mask_offset, int window_left, int window_right, "
        "float softcap, Tensor? alibi_slopes, Tensor? attn_bias, Tensor? sinks, str variant, "
        "Tensor? variant_tensor0, "
        "Tensor? variant_tensor1, Tensor? variant_tensor2, Tensor? variant_tensor3, "
        "Tensor? mask_ranges, float dropout_p, Tensor? dropout_seed, bool deterministic, "
        "bool heads_first, Tensor? cu_seqlens_q=None, "
        "Tensor? cu_seqlens_k=None, SymInt max_seqlen_q=0, SymInt max_seqlen_k=0) "
        "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor dsinks)")
    for op in (FWD, BWD):
        assert torch.Tag.pt2_compliant_tag in op.tags
        assert torch.Tag.needs_fixed_stride_order in op.tags
        for key in ("CUDA", "Meta", "Autograd"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key), key
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU")


# --- fake implementations ---------------------------------------------------------------------

@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "heads_first"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_fwd_fake_has_the_kernels_shapes_and_strides(shape, heads_first):
    with FakeTensorMode():
        q, k, v = make_qkv(shape, device="cuda")
        out, lse = FWD(q, k, v, 0.125, "causal", shape[2] - shape[1], UNBOUNDED, 0, 0.0, None,
                       *NO_EXTRAS, False, heads_first)
    batch, seqlen_q, _, heads, _, _ = shape
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert out.stride() == expected_strides(q.shape, heads_first)
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
    assert lse.device == q.device and lse.is_contiguous()


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "heads_first"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_bwd_fake_has_the_kernels_shapes_and_strides(shape, heads_first):
    with FakeTensorMode():
        q, k, v = make_qkv(shape, device="cuda")
        out, lse = FWD(q, k, v, 0.125, "none", 0, UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, False,
                       heads_first)
        *grads, dbias, dsinks = BWD(torch.randn_like(out), q, k, v, out, lse, False, 0.125,
                                    "none", 0, UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, True,
                                    heads_first)
        _, _, _, full_dbias, _ = BWD(torch.randn_like(out), q, k, v, out, lse, True, 0.125, "none", 0,
                             UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, True, heads_first)
    for grad, t in zip(grads, (q, k, v)):
        assert grad.shape == t.shape and grad.dtype == t.dtype and grad.device == t.device
        assert grad.stride() == expected_strides(t.shape, heads_first)
    batch, seqlen_q, heads, _ = q.shape
    assert dbias.shape == (0,) and dbias.dtype == torch.float32
    assert dsinks.shape == (0,) and dsinks.dtype == torch.float32  # no sinks, no gradient
    assert full_dbias.shape == (batch, heads, seqlen_q, k.shape[1])


def test_fake_implementations_serve_meta_tensors_with_autograd():
    q, k, v = make_qkv(SHAPES[0], device="meta", requires_grad=True)
    out, lse = ops.attention(q, k, v, 0.125, "causal", Band(16), False, heads_first=False)
    assert out.requires_grad and not lse.requires_grad
    out.backward(torch.empty_like(out))
    assert [t.grad.shape for t in (q, k, v)] == [t.shape for t in (q, k, v)]


# --- the public functions' calls of the op ----------------------------------------------------

@pytest.fixture
def attention_calls(monkeypatch):
    """The arguments of every ops.attention call the public functions make."""
    calls = []
    real = ops.attention
    signature = inspect.signature(real)

    def recording(*args, **kwargs):
        calls.append(signature.bind(*args, **kwargs).arguments)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "attention", recording)
    return calls


def test_flash_attn_func_passes_bottom_right_causal_offset_and_deterministic(attention_calls):
    with FakeTensorMode():
        q, k, v = make_qkv(SHAPES[0], device="cuda")
        out, lse, probs = flash_attn_func(q, k, v, softmax_scale=0.5, causal=True,
                                          deterministic=True, return_attn_probs=True)
    (call,) = attention_calls
    assert call["q"] is q and call["k"] is k and call["v"] is v
    assert (call["scale"], call["mask"], call["band"]) == (0.5, "causal", Band(33 - 17))
    assert call["deterministic"] is True and call["heads_first"] is False
    assert out.shape == q.shape and lse.shape == (2, 8, 17) and probs is None


def test_flash_attn_func_default_scale_and_not_deterministic(attention_calls):
    with FakeTensorMode():
        flash_attn_func(*make_qkv(SHAPES[2], device="cuda"))
    (call,) = attention_calls
    assert call["scale"] == 1 / math.sqrt(128) and call["mask"] == "none"
    assert call["deterministic"] is False


@pytest.mark.parametrize("deterministic", [False, True])
def test_sdpa_passes_top_left_causal_heads_first_and_the_global_determinism(attention_calls,
                                                                            deterministic):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with FakeTensorMode():
            q, k, v = (t.transpose(1, 2) for t in make_qkv(SHAPES[0], device="cuda"))
            out = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    finally:
        torch.use_deterministic_algorithms(previous)
    (call,) = attention_calls
    assert call["q"].shape == (2, 17, 8, 64) and call["q"].stride() == q.transpose(1, 2).stride()
    assert (call["mask"], call["band"], call["heads_first"]) == ("causal", Band(0), True)
    assert call["deterministic"] is deterministic
    assert out.shape == q.shape and out.is_contiguous()  # (batch, heads, seq, dim) in memory


# --- autocast ---------------------------------------------------------------------------------

@pytest.fixture
def cuda_autocast_bf16():
    """torch.autocast("cuda") disables itself without CUDA; the state it would set, set directly."""
    previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    yield
    torch.set_autocast_enabled("cuda", previous[0])
    torch.set_autocast_dtype("cuda", previous[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("function", ["flash_attn_func", "sdpa"])
def test_autocast_casts_inputs_to_its_dtype(cuda_autocast_bf16, attention_calls, dtype, function):
    with FakeTensorMode():
        q, k, v = make_qkv(SHAPES[0], dtype=dtype, device="cuda")
        if function == "sdpa":
            out = scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                               enable_gqa=True)
        else:
            out = flash_attn_func(q, k, v)
    (call,) = attention_calls
    assert all(call[name].dtype == torch.bfloat16 for name in "qkv")
    assert out.dtype == torch.bfloat16


def test_autocast_leaves_fp64_alone_as_pytorch_does(cuda_autocast_bf16):
    with FakeTensorMode():
        q, k, v = make_qkv(SHAPES[0], dtype=torch.float64, device="cuda")
        with pytest.raises(TypeError, match="float64 is not supported"):
            flash_attn_func(q, k, v)


def test_autocast_does_not_move_cpu_tensors(cuda_autocast_bf16):
    with pytest.raises(ValueError, match="q is on cpu"):
        flash_attn_func(*make_qkv(SHAPES[0], dtype=torch.float32))


def test_fp32_is_rejected_without_autocast():
    with FakeTensorMode():
        q, k, v = make_qkv(SHAPES[0], dtype=torch.float32, device="cuda")
        with pytest.raises(TypeError, match="torch.float16 or torch.bfloat16"):
            flash_attn_func(q, k, v)


# --- torch.compile's tracing of the public functions ------------------------------------------

class TwoAttentions(torch.nn.Module):
    def forward(self, q, k, v):
        a = flash_attn_func(q, k, v, causal=True)
        b = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, enable_gqa=True)
        return a + b.transpose(1, 2)


def flashgen_calls(graph):
    return [node.args for node in graph.nodes if node.target is FWD]


def test_dynamo_traces_both_functions_into_one_graph():
    """Strict export is dynamo with fullgraph=True: it fails on any graph break."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = make_qkv(SHAPES[0], device="cuda")
        program = torch.export.export(TwoAttentions(), (q, k, v), strict=True)
    calls = flashgen_calls(program.graph)
    assert [call[3:] for call in calls] == [
        (0.125, "causal", 16, UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, False, False),
        (0.125, "causal", 0, UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, False, True)]


def test_dynamo_keeps_the_causal_offset_symbolic_for_dynamic_seqlens():
    seqlen_q, seqlen_k = torch.export.Dim("seqlen_q", min=2), torch.export.Dim("seqlen_k", min=2)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = make_qkv(SHAPES[0], device="cuda")
        program = torch.export.export(TwoAttentions(), (q, k, v), strict=True,
                                      dynamic_shapes=({1: seqlen_q}, {1: seqlen_k}, {1: seqlen_k}))
    offset = flashgen_calls(program.graph)[0][5]
    assert isinstance(offset, torch.fx.Node)  # seqlen_k - seqlen_q, computed at run time


def test_dynamo_traces_the_autocast_cast(cuda_autocast_bf16):
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = make_qkv(SHAPES[0], dtype=torch.float32, device="cuda")
        program = torch.export.export(TwoAttentions(), (q, k, v), strict=True)
    for call in flashgen_calls(program.graph):
        assert all(arg.meta["val"].dtype == torch.bfloat16 for arg in call[:3])


# --- autograd, on CPU tensors with the reference for kernels ----------------------------------

@pytest.fixture
def reference_kernels(monkeypatch):
    """Registers flashgen's own kernel functions for CPU tensors too, with forward.forward and
    backward.backward replaced by the fp32 reference; records what they are called with."""
    calls = {"forward": [], "backward": []}

    def reference_forward(q, k, v, dtype, scale, mask, band, heads_first, *layout, mods):
        assert layout == NO_LAYOUT  # no variable-length or paged arguments
        assert mods.score_mod == "none"
        calls["forward"].append(dict(q=q, k=k, v=v, dtype=dtype, scale=scale, mask=mask,
                                     band=band, heads_first=heads_first))
        assert band.left == UNBOUNDED and band.right == 0  # causal: the reference's mask
        out_ref, lse_ref = attention_ref(q, k, v, mask == "causal", band.offset, scale)
        out, lse = forward.empty_outputs(q, heads_first)
        return out.copy_(out_ref), lse.copy_(lse_ref)

    def reference_backward(dout, q, k, v, out, lse, dtype, scale, mask, band, deterministic,
                           heads_first, *layout, mods, attn_bias_grad):
        assert layout == NO_LAYOUT[:2] + NO_LAYOUT[3:] and mods.score_mod == "none"
        assert not attn_bias_grad
        calls["backward"].append(dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, dtype=dtype,
                                      scale=scale, mask=mask, band=band,
                                      deterministic=deterministic, heads_first=heads_first))
        dq, dk, dv = reference_grads(q, k, v, dout, mask == "causal", band.offset, scale)
        return (*(host.empty_output(t, heads_first).copy_(grad)
                  for t, grad in zip((q, k, v), (dq, dk, dv))), None, None)

    monkeypatch.setattr(forward, "forward", reference_forward)
    monkeypatch.setattr(backward, "backward", reference_backward)
    with torch.library._scoped_library("flashgen", "IMPL") as library:
        library.impl("fwd", ops._fwd_cuda, "CPU")
        library.impl("bwd", ops._bwd_cuda, "CPU")
        yield calls


def reference_grads(q, k, v, dout, causal, causal_offset, scale):
    """dq, dk, dv of attention_ref by the textbook formulas, in fp32 (autograd is off inside an
    op's kernel, where reference_backward runs)."""
    group = q.shape[2] // k.shape[2]
    k_rep, v_rep = (t.float().repeat_interleave(group, dim=2) for t in (k, v))
    q32, dout32 = q.float(), dout.float()
    scores = torch.einsum("bqhd,bkhd->bhqk", q32, k_rep) * scale
    if causal:
        row = torch.arange(q.shape[1]).view(-1, 1)
        col = torch.arange(k.shape[1]).view(1, -1)
        scores = scores.masked_fill(col > row + causal_offset, -math.inf)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dout32)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dout32, v_rep)
    dscores = probs * (dprobs - (dprobs * probs).sum(dim=-1, keepdim=True))
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, k_rep) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, q32) * scale
    batch, seqlen_k, heads_kv, head_dim = k.shape
    dk, dv = (t.view(batch, seqlen_k, heads_kv, group, head_dim).sum(dim=3) for t in (dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def autograd_grads(q, k, v, dout, causal, causal_offset, scale):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _ = attention_ref(*leaves, causal, causal_offset, scale)
    return torch.autograd.grad(out, leaves, dout)


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "heads_first"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=shape_id)
def test_backward_gets_the_forwards_tensors_and_arguments(reference_kernels, shape, causal,
                                                          heads_first):
    q, k, v = make_qkv(shape, requires_grad=True)
    offset = shape[2] - shape[1]
    mask = "causal" if causal else "none"
    out, lse = ops.attention(q, k, v, 0.3, mask, Band(offset), True, heads_first)
    dout = torch.randn_like(out)
    out.backward(dout)

    (forward_call,) = reference_kernels["forward"]
    assert forward_call["dtype"] == "bf16" and forward_call["heads_first"] is heads_first
    (call,) = reference_kernels["backward"]
    assert all(call[name] is t for name, t in zip("qkv", (q, k, v)))
    assert torch.equal(call["dout"], dout)
    assert call["out"].data_ptr() == out.data_ptr() and call["lse"].data_ptr() == lse.data_ptr()
    assert call["dtype"] == "bf16"
    assert (call["scale"], call["mask"], call["band"]) == (0.3, mask, Band(offset))
    assert call["deterministic"] is True and call["heads_first"] is heads_first
    expected = autograd_grads(q, k, v, dout, causal, offset, 0.3)
    for t, grad in zip((q, k, v), expected):
        torch.testing.assert_close(t.grad, grad)  # bf16 tolerances: fp32 sums in another order


def test_expanded_dout_reaches_the_kernel_with_a_contiguous_head_dim(reference_kernels):
    q, k, v = make_qkv(SHAPES[0], requires_grad=True)
    out, _ = ops.attention(q, k, v, 0.125, "none", Band(), False, False)
    out.sum().backward()  # autograd's dout is a ones tensor expanded from a scalar: stride 0
    dout = reference_kernels["backward"][0]["dout"]
    assert dout.stride(-1) == 1 and torch.equal(dout, torch.ones_like(out))


def test_only_inputs_that_require_grad_get_one(reference_kernels):
    q, k, v = make_qkv(SHAPES[0])
    q.requires_grad_()
    out, _ = ops.attention(q, k, v, 0.125, "none", Band(), False, False)
    out.backward(torch.randn_like(out))
    assert q.grad is not None and k.grad is None and v.grad is None


def test_lse_is_not_differentiable(reference_kernels):
    q, k, v = make_qkv(SHAPES[0], requires_grad=True)
    out, lse = ops.attention(q, k, v, 0.125, "none", Band(), False, False)
    assert out.requires_grad and not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()


def test_no_grad_records_no_graph(reference_kernels):
    q, k, v = make_qkv(SHAPES[0], requires_grad=True)
    with torch.no_grad():
        out, _ = ops.attention(q, k, v, 0.125, "none", Band(), False, False)
    assert out.grad_fn is None and not out.requires_grad


def test_double_backward_raises(reference_kernels):
    q, k, v = make_qkv(SHAPES[0], requires_grad=True)
    out, _ = ops.attention(q, k, v, 0.125, "none", Band(), False, False)
    dq, = torch.autograd.grad(out, q, torch.randn_like(out), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        dq.sum().backward()


@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "heads_first"])
def test_opcheck(reference_kernels, heads_first):
    """Schema, autograd registration, fake against real strides, and AOT autograd with dynamic
    shapes (what torch.compile does), for both ops."""
    q, k, v = make_qkv(SHAPES[0], requires_grad=True)
    forward_args = (q, k, v, 0.125, "causal", 16, UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, False,
                    heads_first)
    torch.library.opcheck(FWD, forward_args)
    out, lse = FWD(*forward_args)
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse,
                False, 0.125, "causal", 16, UNBOUNDED, 0, 0.0, None, *NO_EXTRAS, False, heads_first)
    torch.library.opcheck(BWD, bwd_args, test_utils=("test_schema", "test_faketensor",
                                                     "test_aot_dispatch_dynamic"))


def test_compile_fullgraph_matches_eager_forward_and_backward(reference_kernels):
    def attention_loss(q, k, v, dout):
        out, _ = ops.attention(q, k, v, 0.125, "causal", Band(16), False, True)
        return (out * dout).sum()

    compiled = torch.compile(attention_loss, fullgraph=True, backend="aot_eager")
    q, k, v = make_qkv(SHAPES[0], requires_grad=True)
    dout = torch.randn(q.shape, dtype=q.dtype)
    eager_loss = attention_loss(q, k, v, dout)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    compiled_loss = compiled(q, k, v, dout)
    compiled_grads = torch.autograd.grad(compiled_loss, (q, k, v))
    assert torch.equal(compiled_loss, eager_loss)
    for compiled_grad, eager_grad in zip(compiled_grads, eager_grads):
        assert torch.equal(compiled_grad, eager_grad)


@pytest.mark.parametrize("bias_requires_grad", [False, True], ids=["plain_bias", "bias_grad"])
def test_an_additive_bias_gets_the_backwards_dbias_only_when_it_requires_grad(bias_requires_grad):
    """The backward is asked for dbias (its attn_bias_grad flag) exactly when attn_bias requires
    grad, and returns it to attn_bias; q, k and v get their gradients either way."""
    flags = []

    def bwd(dout, q, k, v, out, lse, attn_bias_grad, *rest):
        flags.append(attn_bias_grad)
        dbias = torch.full((2, 8, 17, 33), 7.0) if attn_bias_grad else torch.empty(0)
        return (*(torch.full_like(t, i + 1.0) for i, t in enumerate((q, k, v))), dbias,
                torch.empty(0))

    with torch.library._scoped_library("flashgen", "IMPL") as library:
        library.impl("fwd", lambda q, *rest: forward.empty_outputs(q, False), "CPU")
        library.impl("bwd", bwd, "CPU")
        q, k, v = make_qkv(SHAPES[0], requires_grad=True)
        bias = torch.randn(2, 8, 17, 33, requires_grad=bias_requires_grad)
        out, _ = FWD(q, k, v, 0.125, "none", 0, UNBOUNDED, UNBOUNDED, 0.0, None, bias,
                     *NO_EXTRAS[1:], False, False)
        out.backward(torch.randn_like(out))
    assert flags == [bias_requires_grad]
    assert [t.grad.unique().tolist() for t in (q, k, v)] == [[1.0], [2.0], [3.0]]
    if bias_requires_grad:
        assert torch.equal(bias.grad, torch.full_like(bias, 7.0))
    else:
        assert bias.grad is None


def test_kernels_that_load_by_tma_get_expanded_inputs_copied():
    """A TMA descriptor takes no zero strides: an expanded K (MQA written as expand) is copied
    for the hopper family's forward, and passed as it is to kernels that load with cp.async."""
    from flashgen import host

    k = torch.randn(2, 64, 1, 64, dtype=torch.bfloat16).expand(2, 64, 8, 64)
    assert k.stride()[2] == 0
    assert host.is_aligned(k) and not host.is_aligned(k, tma=True)
    (copied,) = host.aligned(k, tma=True)
    assert 0 not in copied.stride() and torch.equal(copied, k)
    assert host.aligned(k)[0] is k


# --- flash_attn_with_kvcache's op ---------------------------------------------------------------

KVCACHE = torch.ops.flashgen.fwd_kvcache.default


def test_the_kvcache_op_mutates_the_caches_and_has_a_fake():
    schema = KVCACHE._schema
    mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutated == ["k_cache", "v_cache"]
    assert torch.Tag.pt2_compliant_tag in KVCACHE.tags
    for key in ("CUDA", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(KVCACHE.name(), key), key


def test_kvcache_fake_gives_out_like_q_and_lse_per_query_row():
    with FakeTensorMode():
        q = torch.empty(3, 4, 8, 64, dtype=torch.bfloat16, device="cuda")
        cache = torch.empty(16, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
        table = torch.empty(3, 5, dtype=torch.int32, device="cuda")
        seqlens = torch.empty(3, dtype=torch.int32, device="cuda")
        out, lse = KVCACHE(q, cache, cache.clone(), None, None, None, None, seqlens, None, None,
                           table, 0.125, UNBOUNDED, 0, 0.0, None, None, True, 0, "", None, None,
                           None, None)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (3, 8, 4) and lse.dtype == torch.float32


class DecodeStep(torch.nn.Module):
    def forward(self, q, k_cache, v_cache, seqlens):
        return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True)


def test_dynamo_traces_a_decode_step_into_one_op():
    """Strict export fails on any graph break: the known calls' signature is eager-only."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
        k_cache, v_cache = (torch.randn(2, 128, 2, 64, device="cuda", dtype=torch.bfloat16)
                            for _ in range(2))
        seqlens = torch.full((2,), 10, device="cuda", dtype=torch.int32)
        program = torch.export.export(DecodeStep(), (q, k_cache, v_cache, seqlens), strict=True)
    assert [node.target for node in program.graph.nodes if node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload)] == [KVCACHE]
