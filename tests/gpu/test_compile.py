"""flashgen inside PyTorch's machinery, forward and backward: torch.compile(fullgraph=True), CUDA
graph capture and replay, autocast, torch.library.opcheck against the real kernels, and the eager
path that skips the dispatcher.

Gradients are compared bit for bit, so the backward runs deterministically: deterministic=True
for flash_attn_func, torch.use_deterministic_algorithms for the SDPA drop-in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from codegen.params import WINDOW_UNBOUNDED as UNBOUNDED
from flashgen import flash_attn_func, ops, scaled_dot_product_attention

pytestmark = pytest.mark.gpu

FWD = torch.ops.flashgen.fwd.default
BWD = torch.ops.flashgen.bwd.default
# The ops' arguments after alibi_slopes in a call without them: attn_bias, sinks, the variant's
# name, its four tensor slots, mask ranges, dropout_p and dropout_seed.
NO_EXTRAS = (None, None, "", None, None, None, None, None, 0.0, None)


def flash(q, k, v):
    return flash_attn_func(q, k, v, causal=True, deterministic=True)


def sdpa(q, k, v):
    """The drop-in on (batch, seq, heads, dim) tensors, like flash."""
    return scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        is_causal=True, enable_gqa=True).transpose(1, 2)


FUNCTIONS = {"flash_attn_func": flash, "sdpa": sdpa}


@pytest.fixture(autouse=True)
def deterministic_algorithms():
    """warn_only: only the SDPA drop-in's backward needs it, other ops may stay as they are."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(0)
    yield
    torch.use_deterministic_algorithms(previous)


def make_qkv(batch=2, seqlen_q=128, seqlen_k=160, heads=8, heads_kv=2, head_dim=64,
             dtype=torch.bfloat16, requires_grad=True):
    return [torch.randn(batch, s, h, head_dim, device="cuda", dtype=dtype,
                        requires_grad=requires_grad)
            for s, h in ((seqlen_q, heads), (seqlen_k, heads_kv), (seqlen_k, heads_kv))]


def forward_and_grads(function, q, k, v, dout):
    out = function(q, k, v)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def assert_equal(actual, expected):
    (out, grads), (expected_out, expected_grads) = actual, expected
    assert torch.equal(out, expected_out), "out"
    for name, grad, expected_grad in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert torch.equal(grad, expected_grad), name


# --- torch.compile ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compile_fullgraph_matches_eager(name, backend):
    """fullgraph=True fails on any graph break. A second seqlen recompiles with dynamic shapes,
    so the causal offset becomes symbolic."""
    function = FUNCTIONS[name]
    compiled = torch.compile(function, fullgraph=True, backend=backend)
    for seqlen_q in (128, 97):
        q, k, v = make_qkv(seqlen_q=seqlen_q)
        dout = torch.randn_like(q)
        assert_equal(forward_and_grads(compiled, q, k, v, dout),
                     forward_and_grads(function, q, k, v, dout))


class Attention(torch.nn.Module):
    """A self-attention layer: projections around one of the functions."""

    def __init__(self, function, d_model=256, heads=4):
        super().__init__()
        self.function, self.heads = function, heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, seqlen, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, -1).unbind(2)
        return self.proj(self.function(q, k, v).reshape(batch, seqlen, d_model))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compiled_module_matches_eager(name):
    """Inductor compiles the projections its own way: bf16 tolerances for what surrounds
    attention (torch.testing's defaults, about one bf16 rounding)."""
    model = Attention(FUNCTIONS[name]).to("cuda", torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, 256, 256, device="cuda", dtype=torch.bfloat16)
    results = []
    for module in (model, compiled):
        model.zero_grad()
        loss = module(x).float().square().mean()
        loss.backward()
        results.append((loss, [p.grad.clone() for p in model.parameters()]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, eager_loss)
    for compiled_grad, eager_grad in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(compiled_grad, eager_grad)


# --- CUDA graphs -------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [False, True], ids=["inference", "train"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_cuda_graph_capture_and_replay(name, train):
    """Captured once, replayed on new data: the result of an eager call on that data."""
    function = FUNCTIONS[name]
    q, k, v = make_qkv(requires_grad=train)
    dout = torch.randn_like(q)

    def step():
        out = function(q, k, v)
        return (out, torch.autograd.grad(out, (q, k, v), dout)) if train else (out, ())

    side = torch.cuda.Stream()  # warm up (load kernels, fill allocator pools) on a side stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        assert_equal(captured, step())


# --- autocast ----------------------------------------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_autocast_runs_fp32_inputs_in_its_dtype(name, compiled):
    """As PyTorch's SDPA: fp32 inputs are cast to the autocast dtype, the output has that dtype,
    and the gradients flow back to the fp32 inputs in fp32."""
    function = FUNCTIONS[name]
    q, k, v = make_qkv(dtype=torch.float32)
    dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
    run = torch.compile(function, fullgraph=True) if compiled else function
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, grads = forward_and_grads(run, q, k, v, dout)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.float32 for g in grads)

    def cast_by_hand(q, k, v):
        return function(*(t.to(torch.bfloat16) for t in (q, k, v)))

    assert_equal((out, grads), forward_and_grads(cast_by_hand, q, k, v, dout))


def test_autocast_output_dtype_matches_pytorchs_sdpa():
    query, key, value = (t.transpose(1, 2) for t in make_qkv(dtype=torch.float32, heads_kv=8))
    with torch.autocast("cuda", dtype=torch.float16):
        ours = scaled_dot_product_attention(query, key, value)
        theirs = F.scaled_dot_product_attention(query, key, value)
    assert ours.dtype == theirs.dtype == torch.float16


# --- the ops themselves ------------------------------------------------------------------------

@pytest.mark.parametrize("heads_first", [False, True], ids=["bshd", "heads_first"])
@pytest.mark.parametrize("mask, window, softcap", [("none", (UNBOUNDED, UNBOUNDED), 0.0),
                                                   ("causal", (UNBOUNDED, 0), 0.0),
                                                   ("window", (40, 7), 30.0)])
def test_opcheck_with_the_real_kernels(mask, window, softcap, heads_first):
    """Schema, autograd registration, fake against real shapes and strides, and AOT autograd
    with dynamic shapes."""
    q, k, v = make_qkv(seqlen_q=113, seqlen_k=203, head_dim=128)
    forward_args = (q, k, v, 0.125, mask, 203 - 113, *window, softcap, None, *NO_EXTRAS, True,
                    heads_first)
    torch.library.opcheck(FWD, forward_args)
    out, lse = FWD(*forward_args)
    backward_args = (torch.randn_like(out), *(t.detach() for t in (q, k, v, out, lse)), False,
                     0.125, mask, 203 - 113, *window, softcap, None, *NO_EXTRAS, True,
                     heads_first)
    checks = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(BWD, backward_args, test_utils=checks)


def test_plain_eager_calls_skip_the_dispatcher(monkeypatch):
    """Eager calls run the kernel functions without the dispatcher (which costs 10 us of host
    time and more): inference the forward's, a call that records autograd the forward's under
    the op's autograd kernel, and its backward the backward's. Both give the same output."""
    direct = {"fwd": 0, "bwd": 0}

    def counting(name, kernel):
        def counted(*args):
            direct[name] += 1
            return kernel(*args)
        return counted

    monkeypatch.setattr(ops, "_fwd_cuda", counting("fwd", ops._fwd_cuda))
    monkeypatch.setattr(ops, "_bwd_cuda", counting("bwd", ops._bwd_cuda))
    q, k, v = make_qkv()
    with torch.no_grad():
        inference = flash(q, k, v)
    assert direct == {"fwd": 1, "bwd": 0}
    training = flash(q, k, v)
    assert direct == {"fwd": 2, "bwd": 0} and training.grad_fn is not None
    training.backward(torch.randn_like(training))
    assert direct == {"fwd": 2, "bwd": 1}
    assert torch.equal(inference, training)
