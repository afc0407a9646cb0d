"""The shape-aware choice among a head dim's forward tiles, as a pure function (no GPU)."""

from __future__ import annotations

import pytest

from codegen.families.mma import FwdTile as Tile
from flashgen.families.mma.tile_choice import MARGIN, busiest_sm_rows, choose_tile

MAIN = Tile(128, 64, 4, 2)
SMALL = Tile(64, 64, 4, 2)
TILES = (MAIN, SMALL)
H100_SMS = 132


def test_a_single_tile_always_runs():
    assert choose_tile((MAIN,), batch_heads=1, seqlen_q=128, sm_count=H100_SMS) == MAIN


@pytest.mark.parametrize("batch, heads, seqlen", [(16, 16, 1024), (8, 16, 2048), (1, 16, 16384),
                                                  (64, 32, 256)])
def test_enough_blocks_to_fill_the_gpu_run_the_main_tile(batch, heads, seqlen):
    assert choose_tile(TILES, batch * heads, seqlen, H100_SMS) == MAIN


@pytest.mark.parametrize("batch, heads, seqlen", [(1, 16, 512), (1, 2, 4096), (1, 8, 1024),
                                                  (2, 4, 256)])
def test_few_sequences_run_the_small_tile(batch, heads, seqlen):
    """block_m = 128 leaves at least half the SMs idle; block_m = 64 doubles the busy ones."""
    assert choose_tile(TILES, batch * heads, seqlen, H100_SMS) == SMALL


def test_equal_estimates_run_the_main_tile():
    # 128 blocks of 128 rows, one per SM; or 256 blocks of 64 rows, two on most SMs
    assert busiest_sm_rows(128, 16, 1024, H100_SMS) == busiest_sm_rows(64, 16, 1024, H100_SMS)
    assert choose_tile(TILES, 16, 1024, H100_SMS) == MAIN


def test_a_gain_within_the_margin_runs_the_main_tile():
    # 120 blocks on 100 SMs: the busiest SM has 2 x 128 rows; 240 small blocks: 3 x 64
    time_main, time_small = (busiest_sm_rows(t.block_m, 15, 1024, 100) for t in TILES)
    assert 1 < time_main / time_small < MARGIN
    assert choose_tile(TILES, 15, 1024, sm_count=100) == MAIN


def test_variants_with_equal_estimates_resolve_to_the_first():
    other = Tile(64, 128, 4, 2)
    assert choose_tile((MAIN, SMALL, other), 16, 512, H100_SMS) == SMALL
    assert choose_tile((MAIN, other, SMALL), 16, 512, H100_SMS) == other


def test_an_empty_call_runs_the_main_tile():
    assert choose_tile(TILES, 16, 0, H100_SMS) == MAIN
    assert choose_tile(TILES, 0, 512, H100_SMS) == MAIN


def test_the_choice_depends_on_the_sm_count():
    # 64 blocks of 128 rows fill a 64-SM GPU but leave half of an H100 idle
    assert choose_tile(TILES, 16, 512, sm_count=64) == MAIN
    assert choose_tile(TILES, 16, 512, sm_count=H100_SMS) == SMALL


def test_the_choice_is_deterministic():
    shapes = [(bh, s) for bh in (1, 3, 8, 16, 64, 256) for s in (1, 100, 512, 1000, 4096, 16384)]
    first = [choose_tile(TILES, bh, s, H100_SMS) for bh, s in shapes]
    assert [choose_tile(TILES, bh, s, H100_SMS) for bh, s in shapes] == first


def test_busiest_sm_rows_counts_ragged_blocks_whole():
    assert busiest_sm_rows(128, batch_heads=1, seqlen_q=129, sm_count=1) == 256
    assert busiest_sm_rows(128, batch_heads=3, seqlen_q=128, sm_count=2) == 256
