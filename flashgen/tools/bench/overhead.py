"""Host time per small call, flashgen against the C++ entry points PyTorch ships for
FlashAttention-2 and cuDNN (bench --overhead)."""

from __future__ import annotations

import contextlib
import statistics

from flashgen.tools.bench.timing import backend, implementation, timed_call

ROUNDS = 7
AUTOGRAD_FLOOR = "autograd_floor"


def overhead_us(calls: int = 2000) -> dict:
    """Host microseconds per call where the call is CPU-bound, each cell's implementations timed
    in interleaved rounds (the host drifts between rounds more than between implementations),
    the median round per implementation:

    - fwd: dense (1, 64, 1, 64) bf16 inputs without grad; flashgen against SDPA's
      FLASH_ATTENTION;
    - varlen_fwd: two sequences of 32 tokens packed, 1 head, hd64; against FlashAttention-2's
      varlen entry point (aten._flash_attention_forward with cumulative lengths);
    - decode: one new token over a 1k-key cache, batch 1, 32 query and 8 KV heads, hd128, causal
      (flash_attn_with_kvcache with cache_seqlens); against SDPA's FLASH_ATTENTION and
      CUDNN_ATTENTION with enable_gqa;
    - bwd: the dense cell's backward through autograd (out.backward after an untimed forward,
      as the speed grid times it); beside it autograd's own floor (AUTOGRAD_FLOOR: a Python
      autograd node whose backward only allocates the three gradients), not a peer.
    """
    import torch

    cells = {"fwd": _dense("fwd"), "varlen_fwd": _varlen(), "decode": _decode(),
             "bwd": _dense("bwd")}
    result = {}
    for cell, impls in cells.items():
        rounds = {name: [] for name in impls}
        for _ in range(ROUNDS):
            for name, (context, fn, reset) in impls.items():
                with context():
                    rounds[name].append(_per_call_us(fn, reset, calls, torch))
        medians = {name: statistics.median(times) for name, times in rounds.items()}
        result[cell] = {f"{name}_us": round(us, 1) for name, us in medians.items()}
        result[cell]["ratio_to_fastest_peer"] = round(ratio_to_fastest_peer(medians), 3)
    return result


def ratio_to_fastest_peer(medians: dict) -> float:
    """flashgen's host time over the fastest peer's (autograd's floor is no peer)."""
    return medians["flashgen"] / min(us for name, us in medians.items()
                                     if name not in ("flashgen", AUTOGRAD_FLOOR))


def _per_call_us(fn, reset, calls: int, torch) -> float:
    import time

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        if reset is not None:
            reset()
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _dense(mode: str) -> dict:
    import torch

    from flashgen.tools.bench.grid import PEER

    inputs = [[torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]]
    impls = {}
    for name in ("flashgen", PEER):
        with backend(name):  # timed_call's untimed forward runs on the implementation's backend
            fn, sets, reset = timed_call(mode, implementation(name, causal=False), inputs)
        impls[name] = (lambda name=name: backend(name), lambda fn=fn, s=sets[0]: fn(*s),
                       reset and (lambda reset=reset, s=sets[0]: reset(*s)))
    if mode == "bwd":
        fn, sets, reset = timed_call(mode, _allocating_backward(), inputs)
        impls[AUTOGRAD_FLOOR] = (contextlib.nullcontext, lambda: fn(*sets[0]),
                                 lambda: reset(*sets[0]))
    return impls


def _allocating_backward():
    """(q, k, v) -> a copy of q through a Python autograd node whose backward only allocates
    the three gradients: what out.backward() costs before any attention work."""
    import torch

    class AllocatingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return q.clone()

        @staticmethod
        def backward(ctx, dout):
            return tuple(torch.empty_like(t) for t in ctx.saved_tensors)
    return AllocatingBackward.apply


def _varlen() -> dict:
    import torch

    from flashgen import flash_attn_varlen_func

    q, k, v = (torch.randn(64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 32, 64], device="cuda", dtype=torch.int32)
    return {
        "flashgen": (contextlib.nullcontext,
                     lambda: flash_attn_varlen_func(q, k, v, cu, cu, 32, 32), None),
        "FLASH_ATTENTION": (contextlib.nullcontext,
                            lambda: torch.ops.aten._flash_attention_forward(
                                q, k, v, cu, cu, 32, 32, 0.0, False, False), None),
    }


def _decode() -> dict:
    import torch
    import torch.nn.functional as F

    from flashgen import flash_attn_with_kvcache

    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.full((1,), 1024, device="cuda", dtype=torch.int32)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    impls = {"flashgen": (contextlib.nullcontext, lambda: flash_attn_with_kvcache(
        q, k, v, cache_seqlens=lengths, causal=True), None)}
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        impls[name] = (lambda name=name: backend(name), lambda: F.scaled_dot_product_attention(
            qt, kt, vt, enable_gqa=True), None)
    return impls
