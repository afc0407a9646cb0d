"""`python -m flashgen.tools.bench.paged_varlen`: what serving engines' calls cost on flashgen.

- decode: flash_attn_varlen_func over a paged cache (vLLM's call, one query row per sequence)
  against flash_attn_with_kvcache on the same cache and block table, pages of 16 and 64 keys;
- mixed: one batch of a prefill chunk and decode rows against the two run apart;
- sinks: flash_attn_func (forward, and forward + backward) and flash_attn_with_kvcache with s_aux
  against the same calls without.

Serving calls (decode, mixed) are CUDA-graph replays, the training calls eager; every figure is
the median over rounds of medians of CUDA-event times (timing.time_ms), the implementations
interleaved within each round, after a rest.
"""

from __future__ import annotations

import json
import statistics
import sys

from flashgen.tools.bench.serving import _graphed
from flashgen.tools.bench.timing import environment, rest, time_ms

ROUNDS = 3


def _paged_cache(batch, capacity, heads_kv, head_dim, page, dtype):
    import torch

    pages = batch * capacity // page
    k, v = (torch.randn(pages, page, heads_kv, head_dim, device="cuda", dtype=dtype)
            for _ in range(2))
    table = torch.randperm(pages, device="cuda").view(batch, -1).to(torch.int32)
    return k, v, table


def _rounds(calls: dict) -> dict:
    """{name: median over rounds of time_ms} for zero-argument callables, interleaved."""
    times = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, fn in calls.items():
            rest(0.25)
            times[name].append(time_ms(fn, [()], warmup=5, repeats=30))
    return {name: statistics.median(t) for name, t in times.items()}


def decode_cases(dtype, log):
    import torch

    from flashgen import flash_attn_varlen_func, flash_attn_with_kvcache

    heads, heads_kv, head_dim, capacity = 32, 8, 128, 8192
    rows = []
    for batch in (1, 32):
        for page in (16, 64):
            k, v, table = _paged_cache(batch, capacity, heads_kv, head_dim, page, dtype)
            lengths = torch.full((batch,), capacity, dtype=torch.int32, device="cuda")
            q = torch.randn(batch, 1, heads, head_dim, device="cuda", dtype=dtype)
            cu_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
            out = torch.empty(batch, heads, head_dim, device="cuda", dtype=dtype)
            calls = {
                "kvcache": _graphed(lambda: flash_attn_with_kvcache(
                    q, k, v, cache_seqlens=lengths, block_table=table)),
                "varlen": _graphed(lambda: flash_attn_varlen_func(
                    q.view(batch, heads, head_dim), k, v, out=out, cu_seqlens_q=cu_q,
                    max_seqlen_q=1, seqused_k=lengths, max_seqlen_k=capacity,
                    block_table=table)),
            }
            ms = _rounds(calls)
            row = dict(batch=batch, page=page, keys=capacity, **{f"{n}_us": 1e3 * t
                                                                for n, t in ms.items()},
                       ratio=ms["varlen"] / ms["kvcache"])
            log(f"decode batch {batch} page {page}: varlen {row['varlen_us']:.1f} us, kvcache "
                f"{row['kvcache_us']:.1f} us, ratio {row['ratio']:.3f}")
            rows.append(row)
    return rows


def mixed_cases(dtype, log):
    import torch

    from flashgen import flash_attn_varlen_func

    heads, heads_kv, head_dim, capacity, page = 32, 8, 128, 8192, 16
    rows = []
    for prefill_rows, decodes in ((512, 31), (2048, 63)):
        batch = 1 + decodes
        k, v, table = _paged_cache(batch, capacity, heads_kv, head_dim, page, dtype)
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device="cuda")
        query_rows = [prefill_rows] + [1] * decodes
        q = torch.randn(sum(query_rows), heads, head_dim, device="cuda", dtype=dtype)
        starts = torch.tensor([0] + torch.tensor(query_rows).cumsum(0).tolist(),
                              dtype=torch.int32, device="cuda")

        def call(rows, cu, used, block_table, longest):
            out = torch.empty(rows.shape, device="cuda", dtype=dtype)
            buffers.append(out)  # the graph writes it: it must outlive the replays
            return _graphed(lambda: flash_attn_varlen_func(
                rows, k, v, out=out, cu_seqlens_q=cu, max_seqlen_q=longest, seqused_k=used,
                max_seqlen_k=capacity, causal=True, block_table=block_table))

        buffers = []
        decode_starts = torch.arange(decodes + 1, dtype=torch.int32, device="cuda")
        calls = {
            "mixed": call(q, starts, lengths, table, prefill_rows),
            "prefill": call(q[:prefill_rows], starts[:2], lengths[:1], table[:1], prefill_rows),
            "decode": call(q[prefill_rows:], decode_starts, lengths[1:], table[1:], 1),
        }
        ms = _rounds(calls)
        row = dict(prefill_rows=prefill_rows, decode_rows=decodes, keys=capacity, page=page,
                   **{f"{n}_us": 1e3 * t for n, t in ms.items()},
                   ratio=ms["mixed"] / (ms["prefill"] + ms["decode"]))
        log(f"mixed {prefill_rows} prefill + {decodes} decode rows: {row['mixed_us']:.1f} us, "
            f"apart {row['prefill_us']:.1f} + {row['decode_us']:.1f} us, ratio "
            f"{row['ratio']:.3f}")
        rows.append(row)
    return rows


def sinks_cases(dtype, log):
    import torch

    from flashgen import flash_attn_func, flash_attn_with_kvcache

    rows = []
    batch, seqlen, heads, head_dim = 2, 8192, 16, 128
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype,
                           requires_grad=True) for _ in range(3))
    sinks = torch.randn(heads, device="cuda", requires_grad=True)
    dout = torch.randn_like(q)

    def forward(s):
        def run():
            with torch.no_grad():
                flash_attn_func(q, k, v, causal=True, s_aux=s)
        return run

    def training(s):
        def run():
            out = flash_attn_func(q, k, v, causal=True, s_aux=s)
            out.backward(dout)
        return run

    for name, make in (("forward", forward), ("forward+backward", training)):
        ms = _rounds({"plain": make(None), "sinks": make(sinks)})
        rows.append(dict(call=f"flash_attn_func {name}", shape=f"b{batch} s{seqlen} h{heads} "
                         f"d{head_dim} causal", plain_ms=ms["plain"], sinks_ms=ms["sinks"],
                         ratio=ms["sinks"] / ms["plain"]))
        log(f"sinks, {rows[-1]['call']}: {ms['sinks']:.3f} ms against {ms['plain']:.3f} ms, "
            f"ratio {rows[-1]['ratio']:.3f}")
    for batch in (1, 32):
        capacity = 8192
        k_cache, v_cache, table = _paged_cache(batch, capacity, 8, head_dim, 64, dtype)
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device="cuda")
        qd = torch.randn(batch, 1, 32, head_dim, device="cuda", dtype=dtype)
        s32 = torch.randn(32, device="cuda")

        def step(s):
            return _graphed(lambda: flash_attn_with_kvcache(
                qd, k_cache, v_cache, cache_seqlens=lengths, block_table=table, s_aux=s))

        ms = _rounds({"plain": step(None), "sinks": step(s32)})
        rows.append(dict(call=f"flash_attn_with_kvcache decode, batch {batch}",
                         shape=f"8192 keys, page 64, h32/8 d128", plain_ms=ms["plain"],
                         sinks_ms=ms["sinks"], ratio=ms["sinks"] / ms["plain"]))
        log(f"sinks, {rows[-1]['call']}: {1e3 * ms['sinks']:.1f} us against "
            f"{1e3 * ms['plain']:.1f} us, ratio {rows[-1]['ratio']:.3f}")
    return rows


def main(argv=None) -> int:
    import torch

    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else None
    dtype = torch.bfloat16
    result = {"environment": environment(), "decode": decode_cases(dtype, print),
              "mixed": mixed_cases(dtype, print), "sinks": sinks_cases(dtype, print)}
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
