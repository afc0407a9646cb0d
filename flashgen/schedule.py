"""The order in which the forward's and the backward's grids visit their blocks: pure
functions, decoded by templates/include/flashgen/common/block_order.cuh.

Each (batch, head) has `ranks` query blocks, rank 0 the longest (the last block: under causal
masking it sees the most keys). The grid runs them in rounds of `ranks_per_round` ranks, longest
first; within a round, one (batch, head) after another.

Without causal masking every block does the same work, so the order only decides what shares L2:
a single round keeps each (batch, head)'s blocks, which read the same K and V, running together.

Under causal masking block work falls linearly with rank, and a (batch, head)-major order still
starts long blocks in the last wave. Simulated list scheduling of the benchmark grid on 132 SMs
put that tail at 6-15% of the ideal time; one rank per round (longest first across the grid)
removes it, but then the blocks running together come from different (batch, head)s and share
no K/V reads, which a model of DRAM traffic puts at up to 0.8 of the bandwidth at 300 TFLOP/s
(3 TB/s, block_m 128); rounds of w ranks divide that by w and leave a tail of at most w short
blocks. Measured on an H100 (bf16, head dims 64/128/256, seqlen 512-16k, causal; ratios to
FlashAttention-2 in the same process, docs/performance.md "Grid order"): mean 1.055x with one round,
1.106x with 1 or 2 ranks per round, 1.098x with 4, 1.086x with 8. Two keep half the L2 sharing
for the same speed.

The backward was measured the same way and keeps one round for most of its grid: there the blocks
running together also add dQ into one fp32 workspace, whose running part stops fitting in L2 when
they come from many (batch, head)s (mean 0.92x with one round, 0.83x with one rank per round). Its
ranks are key blocks (the dK/dV kernel; the deterministic dQ kernel takes the same order over its
query blocks), and its tiles fill an SM, one block each. Under causal masking only the grid's last
(batch, head)s, as few as hold SORTED_TAIL_WAVES waves of blocks, run longest first across them:
the same list-scheduling model put the one-round tail at 3% of the ideal time at head dim 64
(seqlen 1k-8k) and 6-7% at 128 (1k-8k) and 256 (1k-4k), and at 0.2-1.4% with 4 waves sorted
(docs/performance.md, "Sorted tail and its L2 rule"). Measured on an H100 (bf16 and fp16,
same process, 2 to 6 runs a cell): +1 to +6.5% at hd128 2k-4k, -1 to +7% at hd64 2k-16k (mostly
+2-4%), as long as the tail's (batch, head)s keep their dQ workspace within SORTED_TAIL_L2_SHARE of
L2 (36 MiB of the H100's 50 at hd128 8k and hd256 4k); at 40 MiB (hd128 16k, hd256 8k) sorting lost
up to 6%, so there the grid stays (batch, head)-major.

Without causal masking the backward's blocks are equal, and a grid of B blocks on S SMs (one
block each) ends with a last wave of B mod S blocks running alone: at head dim 64 the benchmark's
4096 blocks make 31.03 waves on an H100, so 4 SMs work through a 32nd block while 128 wait, 3%
of the call (FlashAttention-2's grid has the same tail). The last wave's blocks run split
instead (split_tail): each into `splits` pieces that share out its steps and sum their dK and dV
through an fp32 workspace, so that the tail takes ceil(last_wave * splits / S) rounds of
steps / splits steps each, plus a piece's own cost (SPLIT_PIECE_STEPS: loading K, V and its first
Q/dO tile, adding its dK and dV). Sums in an order that varies, so not on the deterministic path.
Under causal masking the sorted tail already ends the grid on short blocks. Measured on an H100
(bf16 and fp16, split against whole in one process, 2-4 runs a cell, docs/performance.md
"Split tail"): mostly +1.5 to +5.5% at hd64 2k-16k (pieces of 2-16 steps), +1.1 to +1.6% at hd128 8k-16k,
+0.4 to +2.6% at hd256 2k-16k, -1.7 to +1.2% at hd128 2k-4k; pieces of one step gained at most
0.8% (hd64 1k) or lost up to 1% (hd64 512), so a piece gets at least MIN_PIECE_STEPS.
"""

from __future__ import annotations

import functools
from typing import NamedTuple


CAUSAL_RANKS_PER_ROUND = 2
SORTED_TAIL_WAVES = 4
SORTED_TAIL_L2_SHARE = 0.75
SPLIT_PIECE_STEPS = 2
MIN_PIECE_STEPS = 2
MAX_SPLITS = 8


class BwdGrid(NamedTuple):
    """The backward grids' run-time arguments (BwdParams, block_order.cuh): their order, and the
    dK/dV grid's split blocks."""
    sorted_tail_blocks: int = 0
    split_blocks: int = 0
    splits: int = 1


def ranks_per_round(uneven: bool, ranks: int) -> int:
    """Ranks per round for a forward grid of `ranks` query blocks per (batch, head); uneven: its
    mask gives the blocks unequal work (hides_keys)."""
    return max(1, min(ranks, CAUSAL_RANKS_PER_ROUND)) if uneven else max(1, ranks)


def for_spec(spec, seqlen_q: int) -> int:
    """ranks_per_round for a forward KernelSpec's grid on seqlen_q query rows."""
    return ranks_per_round(spec.mask_kind.hides_keys, -(-seqlen_q // spec.tile.block_m))


def sorted_tail_blocks(uneven: bool, key_blocks: int, batch_heads: int,
                       dq_bytes_per_batch_head: int, sm_count: int, l2_bytes: int) -> int:
    """BwdParams.sorted_tail_blocks for a backward grid of batch_heads (batch, KV head)s of
    key_blocks blocks each, each (batch, KV head) adding dQ into dq_bytes_per_batch_head of
    fp32 workspace, on a GPU of sm_count SMs and l2_bytes of L2."""
    if not uneven:
        return 0
    blocks = SORTED_TAIL_WAVES * sm_count
    tail_batch_heads = min(batch_heads, -(-blocks // max(1, key_blocks)))
    if tail_batch_heads * dq_bytes_per_batch_head > SORTED_TAIL_L2_SHARE * l2_bytes:
        return 0
    return blocks


# FlashAttention-2's contract: without deterministic=True only dQ's adds race, dK and dV come out
# the same bits every run. A split tail sums them in an order that varies, so a process that
# installs FA2's API (flashgen.compat.install()) turns it off: keep_dkdv_reproducible().
_dkdv_reproducible = False


def keep_dkdv_reproducible() -> None:
    """From now on no backward in this process splits its tail: dK and dV reproducible bit for
    bit without deterministic=True, as FlashAttention-2 gives them (flashgen.compat.install()
    calls this)."""
    global _dkdv_reproducible
    _dkdv_reproducible = True


def split_tail(uneven: bool, deterministic: bool, blocks: int, steps: int,
               sm_count: int) -> tuple[int, int]:
    """(split_blocks, splits) for a dK/dV grid of `blocks` key blocks of `steps` steps each on
    sm_count SMs: the last wave's blocks, in as many pieces (at most MAX_SPLITS, each of at least
    MIN_PIECE_STEPS steps) as end the grid soonest by the model above, fewer on a tie; (0, 1) for
    no split."""
    if uneven or deterministic or _dkdv_reproducible or blocks % sm_count == 0:
        return 0, 1
    return _split_tail(blocks, steps, sm_count)


@functools.lru_cache(maxsize=1024)  # pure, and asked once per backward call: 4 us on a CPU
def _split_tail(blocks: int, steps: int, sm_count: int) -> tuple[int, int]:
    last_wave = blocks % sm_count

    def tail_steps(splits: int) -> int:
        piece_steps = -(-steps // splits) + (SPLIT_PIECE_STEPS if splits > 1 else 0)
        return -(-last_wave * splits // sm_count) * piece_steps

    most_splits = max(1, min(MAX_SPLITS, steps // MIN_PIECE_STEPS))
    splits = min(range(1, most_splits + 1), key=tail_steps)
    return (last_wave, splits) if splits > 1 else (0, 1)
