"""Which of a head dim's forward tiles runs a call: a pure function of the tiles, the call's shape
and the GPU's SM count.

The model. The forward launches one thread block per block_m query rows of each (batch, head),
and the block scheduler spreads blocks over the SMs before it stacks a second one on any. Every
query row costs the same (a pass over the keys: seqlen_k, or under causal masking half of it on
average, for every tile alike, so neither enters the comparison), and an SM's throughput is taken
as fixed however many blocks it holds. A call then takes as long as its busiest SM needs for its
rows:

    time ~ ceil(blocks / SMs) * block_m,    blocks = batch * heads * ceil(seqlen_q / block_m)

So a smaller block_m pays where the main tile leaves SMs idle: batch 1, 16 heads, seqlen 512 at
block_m = 128 makes 64 blocks for an H100's 132 SMs; block_m = 64 makes 128 and should finish in
about half the time. Blocks resident per SM (shared memory, registers) stay out of the model on
purpose: on the H100 a tile that fits one block per SM ran at 0.83x of the same tile with two
(hd128 m128n64w4s3 against m128n64w4s2), not at the 0.5x that counting resident
blocks as independent slots would predict; an SM's second block hides latency, it does not double
the SM. Under causal masking the longest query blocks run first and the short ones fill the tail,
so the model overstates causal calls' tail and the margin below matters more there.

The main tile is the tuned one: on a full GPU the block_m = 64 alt tiles ran at 0.81-0.93x of it
(`flashgen tune` on the H100, bf16, seqlen 4096, hd64 and hd256; docs/performance.md, "Alt
tiles, shape-aware choice"), so an alt tile has to promise up to 1.23x just to break even. It runs only when the model gives it MARGIN times less time; with block_m halved the
model's ratios are 2 (the main tile fills at most half the SMs), 4/3, 6/5, ..., so 1.5 admits only
the first.
"""

from __future__ import annotations

from collections.abc import Sequence

from codegen.config import Tile

MARGIN = 1.5


def choose_tile(tiles: Sequence[Tile], batch_heads: int, seqlen_q: int, sm_count: int) -> Tile:
    """tiles[0] (the head dim's main tile) unless the quickest of the others, by the model, takes
    MARGIN times less time; equal estimates go to the earlier tile. batch_heads: batch * query
    heads."""
    time = {tile: busiest_sm_rows(tile.block_m, batch_heads, seqlen_q, sm_count) for tile in tiles}
    main, *variants = tiles
    quickest = min(variants, key=time.get, default=main)
    return quickest if time[main] > MARGIN * time[quickest] else main


def busiest_sm_rows(block_m: int, batch_heads: int, seqlen_q: int, sm_count: int) -> int:
    """The query rows the busiest SM works through: the model's time, in rows."""
    blocks = batch_heads * -(-seqlen_q // block_m)
    return -(-blocks // sm_count) * block_m
