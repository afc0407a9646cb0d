# List-scheduling model of the forward grid under causal masking: blocks start in index order
# on the first free slot (132 SMs x resident blocks per SM), a block of rank r of its
# (batch, head) costs its key tiles plus a fixed 0.5 tile. Prints makespan / ideal for rounds of
# 1, 2, 3, 4, 6, 8 ranks and one round (the old order), per head dim and seqlen of the benchmark
# grid (16k tokens, 2048 hidden). Pure Python: python3 simulate_order.py
import heapq


def makespan(jobs, slots):
    free = [0.0] * slots
    end = 0.0
    for cost in jobs:
        t = heapq.heappop(free) + cost
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def order(ranks, pairs, per_round):
    """Ranks in the order block_order.cuh decodes the grid (rank 0: the longest block)."""
    out = []
    for first in range(0, ranks, per_round):
        here = min(per_round, ranks - first)
        for _ in range(pairs):
            out += range(first, first + here)
    return out


def ratio(seqlen, head_dim, block_m, block_n, per_sm, per_round):
    pairs = (16384 // seqlen) * (2048 // head_dim)
    ranks = seqlen // block_m
    cost = lambda rank: -(-(ranks - rank) * block_m // block_n) + 0.5  # noqa: E731
    jobs = [cost(r) for r in order(ranks, pairs, per_round)]
    slots = 132 * per_sm
    return makespan(jobs, slots) / (sum(jobs) / slots)


# head dim: (block_m, block_n, blocks per SM) of the sm_90 main tiles
TILES = {64: (128, 64, 2), 128: (128, 32, 2), 256: (128, 64, 1)}
for head_dim, (block_m, block_n, per_sm) in TILES.items():
    for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
        cells = [(str(w), ratio(seqlen, head_dim, block_m, block_n, per_sm, w))
                 for w in (1, 2, 3, 4, 6, 8)]
        cells.append(("one", ratio(seqlen, head_dim, block_m, block_n, per_sm, seqlen // block_m)))
        print(f"hd{head_dim} {seqlen:6d} " + " ".join(f"{w}:{r:.3f}" for w, r in cells))
