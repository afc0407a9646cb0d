"""How a decode call splits its keys (flashgen/decode.py), on a CPU."""

import pytest

pytest.importorskip("torch")

from flashgen.decode import MAX_SPLITS, choose_splits  # noqa: E402

SLOTS = 264  # an H100: 132 SMs x 2 blocks of the default decode tiles


def test_grids_that_fill_the_gpu_run_unsplit():
    assert choose_splits(256, 2048, SLOTS) == 1
    assert choose_splits(4096, 16, SLOTS) == 1


def test_one_sequence_fills_a_whole_wave():
    # batch 1 x 8 KV heads, a long cache: 33 x 8 = 264 blocks, every slot busy
    assert choose_splits(8, 2048, SLOTS) == 33


def test_a_split_keeps_a_key_block():
    assert choose_splits(8, 16, SLOTS) == 16
    assert choose_splits(8, 3, SLOTS) == 3
    assert choose_splits(64, 8, SLOTS) == 4  # 256 of 264 slots, two key blocks each


def test_no_more_than_a_wave_of_splits():
    for work in (1, 8, 32, 64, 128, 200):
        splits = choose_splits(work, 10**6, SLOTS)
        assert 1 <= splits <= min(MAX_SPLITS, -(-SLOTS // work))
        assert work * splits <= SLOTS + work  # at most one partial wave


def test_the_fewest_splits_among_equally_full_waves():
    assert choose_splits(64, 2048, SLOTS) == 4  # 256 of 264 slots
    assert choose_splits(128, 2048, SLOTS) == 2
