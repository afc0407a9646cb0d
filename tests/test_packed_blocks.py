"""A variable-length batch's packed query blocks (common/packed_blocks.cuh, compiled for the host
by conftest's host_library): the forwards' tiles over them, the rule that picks them over a
dense batch's, and the hopper backward's per-row workspace as Python reads it back."""

from __future__ import annotations

import ctypes
import itertools
import random

import pytest

BLOCKS = (128, 80)  # the forwards' and the hopper backward's query blocks

DECODER = """
#include "flashgen/common/packed_blocks.cuh"
struct Params {
  const int* cu_seqlens_q;
  int batch, heads, seqlen_q, q_view_rows;
};
#define EXPORT(M)                                                                              \\
  extern "C" void tile_##M(const int* cu, int batch, int heads, int seqlen_q, int rows,       \\
                           int index, int longest_first, int* out) {                          \\
    const Params p{cu, batch, heads, seqlen_q, rows};                                          \\
    const flashgen::QueryTile t =                                                              \\
        flashgen::PackedQueryBlocks<M>::tile(p, index, longest_first != 0);                    \\
    out[0] = t.m_block;                                                                        \\
    out[1] = t.head;                                                                           \\
    out[2] = t.batch;                                                                          \\
  }                                                                                            \\
  extern "C" long long tiles_##M(const int* cu, int batch, int heads, int seqlen_q, int rows) { \\
    return flashgen::PackedQueryBlocks<M>::tiles(Params{cu, batch, heads, seqlen_q, rows});    \\
  }                                                                                            \\
  extern "C" int use_tiles_##M(const int* cu, int batch, int heads, int seqlen_q, int rows) {  \\
    return flashgen::PackedQueryBlocks<M>::use_tiles(Params{cu, batch, heads, seqlen_q, rows}); \\
  }                                                                                            \\
  extern "C" long long grid_tiles_##M(const int* cu, int batch, int heads, int seqlen_q,       \\
                                      int rows) {                                              \\
    return flashgen::PackedQueryBlocks<M>::grid_tiles(Params{cu, batch, heads, seqlen_q, rows}); \\
  }                                                                                            \\
  extern "C" long long per_head_##M(long long rows, int batch) {                              \\
    return flashgen::PackedQueryBlocks<M>::per_head(rows, batch);                              \\
  }                                                                                            \\
  extern "C" int first_##M(long long first_row, int b) {                                      \\
    return flashgen::PackedQueryBlocks<M>::first(first_row, b);                                \\
  }
EXPORT(128)
EXPORT(80)
struct DecodeParams {
  const int* cu_seqlens_q;
  int batch, heads, heads_kv, seqlen_q, q_view_rows;
};
extern "C" long long decode_grid(const int* cu, int batch, int heads, int heads_kv, int seqlen_q,
                                 int rows, int* xz) {
  const DecodeParams p{cu, batch, heads, heads_kv, seqlen_q, rows};
  using Blocks = flashgen::DecodeBlocks<64>;
  xz[0] = int(Blocks::grid_x(p));
  xz[1] = int(Blocks::grid_z(p));
  return Blocks::packed(p);
}
extern "C" void decode_block(const int* cu, int batch, int heads, int heads_kv, int seqlen_q,
                             int rows, int x, int z, int* out) {
  const DecodeParams p{cu, batch, heads, heads_kv, seqlen_q, rows};
  const flashgen::QueryTile t = flashgen::DecodeBlocks<64>::block(p, x, z);
  out[0] = t.m_block;
  out[1] = t.head;
  out[2] = t.batch;
}
extern "C" int sequence_of_row(const int* cu, int batch, int row) {
  return flashgen::sequence_of_row(cu, batch, row);
}
"""


@pytest.fixture(scope="module")
def decoder(host_library):
    return host_library("packed_blocks", DECODER)


class Batch:
    """A packed batch's lengths as the C++ side sees them, with `spare` rows after the last."""

    def __init__(self, decoder, block_m: int, lengths: list[int], heads: int, spare: int = 0):
        self.block_m, self.lengths, self.heads = block_m, lengths, heads
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        self.cu = (ctypes.c_int * len(starts))(*starts)
        self.args = (self.cu, len(lengths), heads, max(lengths), starts[-1] + spare)
        self.tiles_fn = getattr(decoder, f"tiles_{block_m}")
        self.tiles_fn.restype = ctypes.c_longlong
        self.tile_fn = getattr(decoder, f"tile_{block_m}")
        self.use_fn = getattr(decoder, f"use_tiles_{block_m}")
        self.grid_fn = getattr(decoder, f"grid_tiles_{block_m}")
        self.grid_fn.restype = ctypes.c_longlong

    def tiles(self) -> int:
        return self.tiles_fn(*self.args)

    def tile(self, index: int, longest_first: bool) -> tuple[int, int, int]:
        out = (ctypes.c_int * 3)()
        self.tile_fn(*self.args, index, int(longest_first), out)
        return tuple(out)

    def use_tiles(self) -> bool:
        return bool(self.use_fn(*self.args))

    def grid_tiles(self) -> int:
        return self.grid_fn(*self.args)

    def dense_tiles(self) -> int:
        return -(-max(self.lengths) // self.block_m) * len(self.lengths) * self.heads

    def query_blocks(self, sequence: int) -> int:
        return -(-self.lengths[sequence] // self.block_m)


@pytest.mark.parametrize("block_m", BLOCKS)
@pytest.mark.parametrize("spare", [0, 300])
@pytest.mark.parametrize("seed", range(4))
def test_every_query_block_is_one_tile_and_the_rest_lie_past_their_sequence(decoder, block_m,
                                                                           spare, seed):
    rng = random.Random(seed)
    lengths = [rng.choice([0, 1, block_m, block_m + 1, rng.randrange(1, 9 * block_m)])
               for _ in range(rng.randrange(1, 40))]
    batch = Batch(decoder, block_m, lengths, heads=3, spare=spare)
    for longest_first in (False, True):
        seen, gaps = [], {}
        for index in range(batch.tiles()):
            m_block, head, sequence = batch.tile(index, longest_first)
            assert 0 <= sequence < len(lengths) and 0 <= head < 3
            if m_block < batch.query_blocks(sequence):
                seen.append((sequence, head, m_block))
            else:
                gaps[sequence, head] = gaps.get((sequence, head), 0) + 1
        every_block = [(s, h, m) for s in range(len(lengths)) for h in range(3)
                       for m in range(batch.query_blocks(s))]
        assert sorted(seen) == every_block
        # one gap at most after each sequence's blocks, besides the spare rows after the last
        last = len(lengths) - 1
        assert all(n <= 1 for (s, _), n in gaps.items() if s != last)


def test_a_sequences_blocks_run_together_last_first(decoder):
    batch = Batch(decoder, 128, [300, 0, 1000], heads=2)
    order = [batch.tile(i, longest_first=True) for i in range(batch.tiles())]
    real = [t for t in order if t[0] < batch.query_blocks(t[2])]
    assert real == [(2, 0, 0), (1, 0, 0), (0, 0, 0), (2, 1, 0), (1, 1, 0), (0, 1, 0),
                    (7, 0, 2), (6, 0, 2), (5, 0, 2), (4, 0, 2), (3, 0, 2), (2, 0, 2),
                    (1, 0, 2), (0, 0, 2), (7, 1, 2), (6, 1, 2), (5, 1, 2), (4, 1, 2),
                    (3, 1, 2), (2, 1, 2), (1, 1, 2), (0, 1, 2)]


def test_equal_lengths_keep_the_dense_tiles_and_skewed_ones_take_their_own(decoder):
    """A dense batch of equal lengths has no tile past a sequence; the packed tiles would add a
    gap per sequence and head. Beside one long sequence, short ones would leave the dense
    batch's tiles mostly empty."""
    equal = Batch(decoder, 128, [2048] * 8, heads=16)
    assert not equal.use_tiles()
    assert equal.grid_tiles() == equal.dense_tiles() == 16 * 8 * 16
    for skewed in (Batch(decoder, 128, [8192] + [300] * 62, heads=32),
                   Batch(decoder, 80, [8192] + [1] * 62, heads=32)):
        assert skewed.use_tiles()
        assert skewed.grid_tiles() == skewed.tiles() < skewed.dense_tiles()


def test_a_batch_of_empty_sequences_launches_no_tile(decoder):
    assert Batch(decoder, 128, [0, 0, 0], heads=8, spare=5).grid_tiles() == 0


@pytest.mark.parametrize("lengths", [[37, 300, 129, 1], [0, 5, 0, 80], [200]])
def test_the_hopper_backwards_row_terms_read_back_in_the_lses_layout(decoder, lengths):
    """hopper.softmax_d gathers D of a packed batch from the backward's workspace rows, which
    QueryBlockLayout lays out per head in whole query blocks, each sequence from its first
    (PackedQueryBlocks::first): every packed row of every head reads its own row there."""
    from types import SimpleNamespace

    import torch

    from flashgen.families import hopper

    block_m, heads, head_dim = 80, 3, 8
    total = sum(lengths)
    per_head = getattr(decoder, f"per_head_{block_m}")
    per_head.restype = ctypes.c_longlong
    blocks = per_head(total, len(lengths))
    rows = heads * blocks * block_m
    scratch = torch.full((rows * (head_dim + 2),), float("nan"))
    expected = torch.empty(1, heads, total)
    start = 0
    for b, n in enumerate(lengths):
        first = getattr(decoder, f"first_{block_m}")(start, b)
        for head in range(heads):
            for r in range(n):
                at = (head * blocks + first) * block_m + r
                scratch[rows * head_dim + at] = expected[0, head, start + r] = float(at)
        start += n
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    spec = SimpleNamespace(tile=SimpleNamespace(block_m=block_m))
    got = hopper.softmax_d(spec, scratch, torch.empty(1, total, heads, head_dim),
                           (cu, cu, max(lengths), max(lengths)))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("lengths", [[512] + [1] * 31, [1, 0, 300, 4, 0, 37, 1], [5] * 8])
def test_the_decode_grid_runs_each_sequences_packed_blocks_once(decoder, lengths):
    """The decode kernel's blocks of 64 packed rows (token x 4 query heads per KV head): every
    query block of every sequence and KV head is one block of the grid, the others lie past
    their sequence's rows; beside a long sequence the grid is the packed one, far smaller than
    a dense batch of the longest, and equal lengths keep the dense grid."""
    heads, heads_kv, block_m = 8, 2, 64
    group = heads // heads_kv
    cu = (ctypes.c_int * (len(lengths) + 1))(0, *itertools.accumulate(lengths))
    args = (cu, len(lengths), heads, heads_kv, max(lengths), sum(lengths))
    xz = (ctypes.c_int * 2)()
    packed = decoder.decode_grid(*args, xz)
    blocks = [-(-n * group // block_m) for n in lengths]
    dense = len(lengths) * max(blocks) * heads_kv
    assert bool(packed) == (len(set(lengths)) > 1)
    assert xz[0] * xz[1] <= dense
    if len(lengths) == 32:
        assert xz[0] * xz[1] < dense / 10
    seen = []
    out = (ctypes.c_int * 3)()
    for x in range(xz[0]):
        for z in range(xz[1]):
            decoder.decode_block(*args, x, z, out)
            m_block, head_kv, sequence = out
            assert 0 <= sequence < len(lengths) and 0 <= head_kv < heads_kv
            if m_block < blocks[sequence]:
                seen.append((sequence, head_kv, m_block))
    assert sorted(seen) == [(s, h, m) for s in range(len(lengths)) for h in range(heads_kv)
                            for m in range(blocks[s])]


def test_a_packed_row_belongs_to_the_sequence_that_holds_it(decoder):
    lengths = [3, 0, 0, 2, 0, 1]
    cu = (ctypes.c_int * 7)(0, *itertools.accumulate(lengths))
    owners = [b for b, n in enumerate(lengths) for _ in range(n)]
    assert [decoder.sequence_of_row(cu, 6, row) for row in range(6)] == owners
