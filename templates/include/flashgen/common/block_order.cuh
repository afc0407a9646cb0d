// Which block of work a thread block of a 1-D grid runs. Python chooses the order
// (flashgen/schedule.py); this only decodes it. block_work orders the mma forward's grid,
// block_work_sorted_tail the backward's (both families), grid_piece the mma backward's.
//
// Each (batch, head) has `ranks` blocks of work, rank 0 the longest (the forward's last query
// block under causal masking). The GPU starts thread blocks in index order as SMs free up, so a
// grid ordered by decreasing work ends on short blocks and leaves no SM running a long one
// alone. Blocks of one (batch, head) also share its K and V through L2, but only while they run
// at the same time.
// So the grid visits the ranks in rounds of `ranks_per_round`, longest first, and within a round
// runs one (batch, head) after another, each with its ranks of the round:
//   ranks_per_round = ranks: one (batch, head) after another, its longest block first;
//   ranks_per_round = 1: every (batch, head)'s longest block, then every second-longest, ...
#pragma once

namespace flashgen {

struct BlockWork {
  int rank;        // 0: the (batch, head)'s longest block
  int batch_head;  // batch * heads + head
};

// Host too, so that a CPU test can check the decoding (tests/test_schedule.py).
__host__ __device__ __forceinline__ BlockWork block_work(int block, int ranks, int batch_heads,
                                                         int ranks_per_round) {
  const int per_round = ranks_per_round < 1 || ranks_per_round > ranks ? ranks : ranks_per_round;
  const int first_rank = block / (per_round * batch_heads) * per_round;
  const int left = ranks - first_rank;
  const int ranks_here = left < per_round ? left : per_round;  // the last round may be short
  const int in_round = block - first_rank * batch_heads;
  return {first_rank + in_round % ranks_here, in_round / ranks_here};
}

// The backward's order: one (batch, head) after another, its longest block first, so that the
// blocks running together share their (batch, head)'s reads and dQ adds in L2 (the forward's
// rounds of ranks cost the backward that, schedule.py). Only the last (batch, head)s, as few
// as hold `tail_blocks` blocks, interleave theirs longest first across them, so that the grid
// ends on short blocks, not on a long one started in its last wave.
__host__ __device__ __forceinline__ BlockWork block_work_sorted_tail(int block, int ranks,
                                                                     int batch_heads,
                                                                     int tail_blocks) {
  const int wanted = (tail_blocks + ranks - 1) / ranks;
  const int tail = wanted < batch_heads ? wanted : batch_heads;
  const int head_blocks = (batch_heads - tail) * ranks;
  if (block < head_blocks) return {block % ranks, block / ranks};
  const BlockWork work = block_work(block - head_blocks, ranks, tail, 1);
  return {work.rank, batch_heads - tail + work.batch_head};
}

// The dK/dV grid with its last split_blocks blocks split into `splits` pieces each, which share
// out the block's steps. Equal blocks on S SMs leave a last wave of blocks % S blocks running
// alone: 4 of 132 SMs busy for a whole block at head dim 64 (4096 blocks, 31.03 waves). Run as
// pieces, the same work spreads over the idle SMs (flashgen/schedule.py decides). Whole blocks
// come first, in their order; then piece 0 of every split block, piece 1, ..., so that pieces
// running together walk the same query blocks, as whole blocks of one (batch, head) do.
struct GridPiece {
  int block;   // index in the grid without splits (block_work_sorted_tail decodes it)
  int piece;   // 0 <= piece < pieces
  int pieces;  // 1: a whole block
};

__host__ __device__ __forceinline__ GridPiece grid_piece(int index, int blocks, int split_blocks,
                                                         int splits) {
  const int whole_blocks = blocks - split_blocks;
  if (index < whole_blocks || splits < 2) return {index, 0, 1};
  const int in_tail = index - whole_blocks;
  return {whole_blocks + in_tail % split_blocks, in_tail / split_blocks, splits};
}

}  // namespace flashgen
