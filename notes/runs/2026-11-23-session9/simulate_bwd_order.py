# List-scheduling model of the backward's causal grid (blocks start in index order on the first
# free SM, one block per SM; a key block costs the query blocks it sees plus c fixed steps):
# makespan / ideal for the (batch, head)-major order and for the order with the last (batch,
# head)s, as few as hold `waves` x 132 blocks, sorted longest first (block_order.cuh's
# block_work_sorted_tail). The benchmark grid: 16k tokens, 2048 hidden. python3 simulate_bwd_order.py
import heapq
import math

SMS = 132


def makespan(jobs):
    free = [0.0] * SMS
    end = 0.0
    for cost in jobs:
        t = heapq.heappop(free) + cost
        end = max(end, t)
        heapq.heappush(free, t)
    return end


# head dim: (block_m, block_n) of the sm_90 backward tiles
TILES = {64: (128, 128), 128: (64, 128), 256: (64, 64)}
for head_dim, (block_m, block_n) in TILES.items():
    for seqlen in (1024, 2048, 4096, 8192, 16384):
        pairs, key_blocks, query_blocks = (16384 // seqlen) * (2048 // head_dim), \
            seqlen // block_n, seqlen // block_m
        cells = []
        for c in (0.5, 2.0):
            cost = lambda n: query_blocks - n * block_n // block_m + c  # noqa: E731
            jobs = [cost(n) for _ in range(pairs) for n in range(key_blocks)]
            ideal = sum(jobs) / SMS
            cells.append(f"c={c}: major {makespan(jobs) / ideal:.3f}")
            for waves in (2, 4):
                tail = min(pairs, math.ceil(waves * SMS / key_blocks))
                sorted_jobs = ([cost(n) for _ in range(pairs - tail) for n in range(key_blocks)]
                               + [cost(n) for n in range(key_blocks) for _ in range(tail)])
                cells.append(f"{waves} waves {makespan(sorted_jobs) / ideal:.3f}")
        print(f"hd{head_dim} {seqlen:6d} " + "  ".join(cells))
