"""How a decode call splits its keys and when chunked prefill takes a forward (flashgen/decode.py),
on a CPU."""

from types import SimpleNamespace

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


def test_chunked_prefill_takes_a_forward_that_reads_the_cache_from_256_new_tokens(monkeypatch):
    """From FORWARD_PREFILL_TOKENS new tokens, where a family's forward reads caches (faked here:
    a tile of 128 keys) and the pages are whole key blocks of it."""
    import torch

    from flashgen import decode

    attention = (SimpleNamespace(spec=SimpleNamespace(tile=SimpleNamespace(block_n=128))), {})
    monkeypatch.setattr(decode.forward, "plan", lambda *args: attention)

    def runs_on_forward(new_tokens, page_size=None):
        q = torch.empty(1, new_tokens, 8, 64)
        cache = torch.empty(4, page_size or 1024, 2, 64)
        return decode._cache_forward(0, "bf16", 64, "causal", 8, new_tokens, q, cache, cache,
                                     page_size is not None, "none") is not None

    assert decode.FORWARD_PREFILL_TOKENS == 256
    assert not runs_on_forward(255) and runs_on_forward(256)
    assert runs_on_forward(512, page_size=256) and not runs_on_forward(512, page_size=64)
    monkeypatch.setattr(decode.forward, "plan", lambda *args: None)  # no such forward
    assert not runs_on_forward(512)


def test_a_mixed_batch_runs_its_decode_sized_sequences_apart():
    """flash_attn_varlen_func over a paged cache with prefill and decode rows: the sequences of
    fewer than PREFILL_ROWS packed rows take the decode tile in a launch of their own."""
    from flashgen.decode import PREFILL_ROWS, mixed_decode_tokens

    assert PREFILL_ROWS == 256
    # 512 prefill tokens and 31 one-token rows, 4 query heads per KV head: up to 63 tokens apart
    assert mixed_decode_tokens(batch=32, total=543, longest=512, group=4) == 63
    assert mixed_decode_tokens(batch=6, total=343, longest=300, group=1) == 255
    assert mixed_decode_tokens(batch=4, total=4 * 512, longest=512, group=4) == 0  # all prefill
    assert mixed_decode_tokens(batch=32, total=32, longest=1, group=4) == 0  # all decode
    assert mixed_decode_tokens(batch=1, total=512, longest=512, group=4) == 0
