"""`flashgen bench`: flashgen against PyTorch's SDPA backends, in one process, on one GPU.

FlashAttention's convention: batch * seqlen = 16k tokens, nheads * headdim = 2048; forward FLOPs
4 * batch * heads * seqlen_q * seqlen_k * headdim, halved when causal.
"""

from __future__ import annotations

import statistics

TOKENS = 16384
HIDDEN = 2048


def forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal) -> float:
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def grid_shape(seqlen: int, head_dim: int) -> tuple[int, int]:
    """(batch, heads) for the convention above."""
    return max(1, TOKENS // seqlen), HIDDEN // head_dim


def time_ms(fn, inputs: list, warmup: int = 5, repeats: int = 30) -> float:
    """Median of CUDA-event-timed calls, rotating through several input sets."""
    import torch

    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def implementations(causal: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashgen import flash_attn_func

    def sdpa(backend):
        def run(q, k, v):  # q, k, v: (batch, seq, heads, dim) as flash_attn_func takes them
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                      v.transpose(1, 2), is_causal=causal)
        return run

    return {
        "flashgen": lambda q, k, v: flash_attn_func(q, k, v, causal=causal),
        "FLASH_ATTENTION": sdpa(SDPBackend.FLASH_ATTENTION),
        "CUDNN_ATTENTION": sdpa(SDPBackend.CUDNN_ATTENTION),
    }


def run(dtypes=("bf16",), head_dims=(64, 128, 256), seqlens=(4096,), causal=(False, True)):
    import torch

    torch_dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rows = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for is_causal in causal:
                for seqlen in seqlens:
                    batch, heads = grid_shape(seqlen, head_dim)
                    inputs = [[torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                                           dtype=torch_dtypes[dtype]) for _ in range(3)]
                              for _ in range(3)]
                    flops = forward_flops(batch, heads, seqlen, seqlen, head_dim, is_causal)
                    row = {"dtype": dtype, "head_dim": head_dim, "causal": is_causal,
                           "seqlen": seqlen}
                    for name, fn in implementations(is_causal).items():
                        try:
                            row[name] = flops / time_ms(fn, inputs) / 1e9
                        except RuntimeError as e:  # a backend that cannot run this shape
                            row[name] = None
                            print(f"{name} failed: {str(e).splitlines()[0]}")
                    rows.append(row)
                    print(format_row(row), flush=True)
    return rows


def format_row(row) -> str:
    def tf(x):
        return f"{x:7.1f}" if x is not None else "    n/a"

    ratio = (row["flashgen"] / row["FLASH_ATTENTION"]
             if row.get("flashgen") and row.get("FLASH_ATTENTION") else None)
    ratio_text = f"{ratio:.2f}x" if ratio else "n/a"
    return (f"{row['dtype']} hd{row['head_dim']:<4d} {'causal' if row['causal'] else 'full  '} "
            f"seqlen {row['seqlen']:6d}  flashgen {tf(row['flashgen'])}  FLASH_ATTENTION "
            f"{tf(row['FLASH_ATTENTION'])}  CUDNN {tf(row['CUDNN_ATTENTION'])} TFLOP/s  "
            f"flashgen/FLASH_ATTENTION {ratio_text}")


def overhead_us(calls: int = 2000) -> dict:
    """Host time per tiny call (batch 1, 1 head, seqlen 64, head dim 64), CPU-bound: flashgen
    against SDPA's FLASH_ATTENTION backend. Microseconds per call, median of 5 rounds."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashgen import flash_attn_func

    q, k, v = (torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def per_call(fn):
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(rounds)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fa2 = per_call(lambda: F.scaled_dot_product_attention(qt, kt, vt))
    ours = per_call(lambda: flash_attn_func(q, k, v))
    return {"flashgen_us": ours, "FLASH_ATTENTION_us": fa2, "ratio": ours / fa2}
