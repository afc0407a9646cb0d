"""The hopper family's run-time decisions (codegen/families/hopper/ builds its kernels): which of
a head dim's forward tiles runs a call.

A head dim's (or a mask's) alt tiles are short-sequence tiles. The main tiles are sized for long
rows; on short ones a smaller tile wastes fewer rows past the sequence and less work on the
causal diagonal, and a narrower block_n can leave room for an output buffer of its own (so the
blocks walk tiles). Measured on the H100 (bf16, causal, against the main tile, two runs each;
docs/performance.md, "The hopper forward"): head dim 64 at 128 x 128 instead of 192 x 128 ran
+13-18% at seqlen 512-1k, level at 2k and 6-8% slower from 4k; head dim 192 at block_n 64
instead of 112 +20% at 512, level at 2k, 7% slower from 4k. So the first alt tile runs calls of
at most SHORT_SEQLEN query rows. The plan is cached per seqlen_q, not seqlen_k: a short query
block against a long cache (chunked prefill) counts as short.
"""

from __future__ import annotations

SHORT_SEQLEN = 1024


def forward_plan(candidates, batch_heads: int, seqlen_q: int, device_index: int):
    """The spec that runs a forward call of this shape among a head dim's candidates (the main
    tile first), and its FwdParams fields (none beyond the shared ones; the forward adds the
    tile counter per call)."""
    main, *alts = candidates
    return (alts[0] if alts and seqlen_q <= SHORT_SEQLEN else main), {}
