// Which block of work a thread block of a 1-D grid runs. Python chooses the order
// (flashgen/schedule.py); this only decodes it.
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

}  // namespace flashgen
