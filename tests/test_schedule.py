"""The grids' orders: schedule.py's choices, and common/block_order.cuh's decoding of them
(compiled for the host by conftest's host_library, called through ctypes)."""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace

import pytest

from codegen.masks import MASKS
from flashgen import schedule

DECODER = """
#include "flashgen/common/block_order.cuh"
extern "C" void decode(int block, int ranks, int batch_heads, int ranks_per_round, int* out) {
  const flashgen::BlockWork work = flashgen::block_work(block, ranks, batch_heads, ranks_per_round);
  out[0] = work.rank;
  out[1] = work.batch_head;
}
extern "C" void decode_sorted_tail(int block, int ranks, int batch_heads, int tail_blocks,
                                   int* out) {
  const flashgen::BlockWork work =
      flashgen::block_work_sorted_tail(block, ranks, batch_heads, tail_blocks);
  out[0] = work.rank;
  out[1] = work.batch_head;
}
extern "C" void decode_piece(int index, int blocks, int split_blocks, int splits, int* out) {
  const flashgen::GridPiece piece = flashgen::grid_piece(index, blocks, split_blocks, splits);
  out[0] = piece.block;
  out[1] = piece.piece;
  out[2] = piece.pieces;
}
"""


def test_without_causal_masking_each_batch_head_runs_its_blocks_together():
    assert schedule.ranks_per_round(False, 128) == 128


def test_under_causal_masking_rounds_hold_a_few_ranks_longest_first():
    assert schedule.ranks_per_round(True, 128) == schedule.CAUSAL_RANKS_PER_ROUND
    assert schedule.ranks_per_round(True, 1) == 1


def test_a_grid_without_blocks_still_gets_a_valid_round():
    assert schedule.ranks_per_round(False, 0) == schedule.ranks_per_round(True, 0) == 1


MIB = 2**20


def test_the_backward_sorts_a_tail_of_waves_under_causal_masking():
    # 4 waves of 132 blocks, 16 per (batch, head): 33 (batch, head)s of 1 MiB of dQ each
    assert schedule.sorted_tail_blocks(True, 16, 256, MIB, 132, 50 * MIB) == (
        schedule.SORTED_TAIL_WAVES * 132)
    assert schedule.sorted_tail_blocks(False, 16, 256, MIB, 132, 50 * MIB) == 0


def test_the_sorted_tail_keeps_its_dq_workspace_within_l2():
    assert schedule.sorted_tail_blocks(True, 16, 256, 2 * MIB, 132, 50 * MIB) == 0  # 66 MiB
    # a grid smaller than the tail sorts all of its (batch, head)s: 4 x 2 MiB
    assert schedule.sorted_tail_blocks(True, 16, 4, 2 * MIB, 132, 50 * MIB) > 0


def test_non_causal_backward_grids_split_their_last_wave():
    # hd64's benchmark grid: 4096 key blocks of 128 steps, 31.03 waves on 132 SMs; 4 blocks in
    # MAX_SPLITS pieces still fit one round
    assert schedule.split_tail(False, False, 4096, 128, 132) == (4, schedule.MAX_SPLITS)
    # hd128 at 16k: 2048 blocks of 256 steps leave 68; in 7 pieces, 4 rounds of 37 + 2 steps
    # (156) against 256 whole; 3 pieces take 2 rounds of 88, 5 pieces 3 of 54
    assert schedule.split_tail(False, False, 2048, 256, 132) == (68, 7)


def test_pieces_keep_at_least_their_minimum_of_steps():
    assert schedule.split_tail(False, False, 4096, 8, 132) == (4, 8 // schedule.MIN_PIECE_STEPS)


def test_a_grid_smaller_than_the_gpu_splits_every_block():
    assert schedule.split_tail(False, False, 64, 32, 132) == (64, 2)


@pytest.mark.parametrize("causal, deterministic, blocks, steps", [
    (True, False, 4096, 128),   # under causal masking the sorted tail ends on short blocks
    (False, True, 4096, 128),   # pieces add in any order
    (False, False, 2 * 132, 128),  # whole waves
    (False, False, 4096, 2),    # pieces would cost more than they share out
    (False, False, 4096, 4),    # pieces of MIN_PIECE_STEPS tie with the whole blocks
])
def test_backward_grids_split_only_where_it_shortens_an_unsorted_tail(causal, deterministic,
                                                                      blocks, steps):
    assert schedule.split_tail(causal, deterministic, blocks, steps, 132) == (0, 1)


def test_under_fa2s_contract_no_tail_splits(monkeypatch):
    """flashgen.compat keeps dK and dV reproducible without deterministic=True (FA2's tests
    compare them bit for bit across runs): no pieces summing in a varying order."""
    assert schedule.split_tail(False, False, 4096, 128, 132) != (0, 1)
    schedule.keep_dkdv_reproducible()
    assert schedule.split_tail(False, False, 4096, 128, 132) == (0, 1)


def test_installing_the_fa2_package_keeps_dkdv_reproducible(monkeypatch):
    from flashgen import compat

    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    compat.install()
    assert schedule.split_tail(False, False, 4096, 128, 132) == (0, 1)


def test_a_spec_has_a_rank_per_query_block():
    spec = SimpleNamespace(tile=SimpleNamespace(block_m=128), mask_kind=MASKS["none"])
    assert schedule.for_spec(spec, 1000) == 8  # ceil(1000 / 128) query blocks, one round


@pytest.fixture(scope="module")
def decoder(host_library):
    return host_library("block_order", DECODER)


def decoded(function):
    """function(block, ranks, batch_heads, order argument) as a (rank, batch_head) tuple."""
    def work(block, ranks, batch_heads, argument):
        out = (ctypes.c_int * 2)()
        function(block, ranks, batch_heads, argument, out)
        return tuple(out)

    return work


@pytest.fixture(scope="module")
def block_work(decoder):
    return decoded(decoder.decode)


@pytest.fixture(scope="module")
def block_work_sorted_tail(decoder):
    return decoded(decoder.decode_sorted_tail)


def order(block_work, ranks, batch_heads, ranks_per_round):
    return [block_work(b, ranks, batch_heads, ranks_per_round)
            for b in range(ranks * batch_heads)]


@pytest.mark.parametrize("ranks, batch_heads", [(1, 1), (1, 5), (7, 1), (16, 64), (9, 3)])
@pytest.mark.parametrize("ranks_per_round", [1, 2, 3, 4, 100])
def test_every_block_of_work_runs_once_and_rounds_go_longest_first(block_work, ranks,
                                                                   batch_heads, ranks_per_round):
    visited = order(block_work, ranks, batch_heads, ranks_per_round)
    assert sorted(visited) == [(r, bh) for r in range(ranks) for bh in range(batch_heads)]
    per_round = min(ranks_per_round, ranks)
    rounds = [rank // per_round for rank, _ in visited]
    assert rounds == sorted(rounds)


def test_one_round_is_batch_head_major_with_the_longest_block_first(block_work):
    assert order(block_work, 3, 2, 3) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_one_rank_per_round_is_longest_first_across_the_grid(block_work):
    assert order(block_work, 3, 2, 1) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_rounds_of_two_ranks_end_with_a_short_round(block_work):
    assert order(block_work, 3, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]


def test_an_out_of_range_round_means_one_round(block_work):
    assert order(block_work, 3, 2, 0) == order(block_work, 3, 2, 3)


@pytest.mark.parametrize("ranks, batch_heads", [(1, 1), (1, 5), (7, 1), (16, 64), (9, 3)])
@pytest.mark.parametrize("tail_blocks", [0, 1, 9, 40, 10**6])
def test_the_backward_runs_every_block_once_and_its_tail_longest_first(block_work_sorted_tail,
                                                                        ranks, batch_heads,
                                                                        tail_blocks):
    visited = order(block_work_sorted_tail, ranks, batch_heads, tail_blocks)
    assert sorted(visited) == [(r, bh) for r in range(ranks) for bh in range(batch_heads)]
    tail = min(batch_heads, -(-tail_blocks // ranks))  # whole (batch, head)s
    head_blocks = (batch_heads - tail) * ranks
    assert visited[:head_blocks] == [(r, bh) for bh in range(batch_heads - tail)
                                     for r in range(ranks)]
    assert visited[head_blocks:] == [(r, bh) for r in range(ranks)
                                     for bh in range(batch_heads - tail, batch_heads)]


def test_a_sorted_tail_takes_whole_batch_heads(block_work_sorted_tail):
    # 3 blocks in the tail need 2 of the 3 (batch, head)s of 2 ranks
    assert order(block_work_sorted_tail, 2, 3, 3) == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1),
                                                      (1, 2)]


@pytest.fixture(scope="module")
def grid_piece(decoder):
    def piece(index, blocks, split_blocks, splits):
        out = (ctypes.c_int * 3)()
        decoder.decode_piece(index, blocks, split_blocks, splits, out)
        return tuple(out)

    return piece


@pytest.mark.parametrize("blocks, split_blocks, splits", [(10, 0, 1), (10, 3, 4), (10, 10, 2),
                                                          (7, 2, 1), (1, 1, 8)])
def test_split_blocks_run_as_pieces_after_the_whole_ones(grid_piece, blocks, split_blocks,
                                                         splits):
    pieces = splits if split_blocks and splits > 1 else 1
    grid_size = blocks + (split_blocks * (splits - 1) if pieces > 1 else 0)
    visited = [grid_piece(index, blocks, split_blocks, splits) for index in range(grid_size)]
    whole = blocks - split_blocks if pieces > 1 else blocks
    assert visited[:whole] == [(block, 0, 1) for block in range(whole)]
    # piece-major: piece 0 of every split block, then piece 1, ...
    assert visited[whole:] == [(block, piece, pieces) for piece in range(pieces)
                               for block in range(whole, blocks)]
