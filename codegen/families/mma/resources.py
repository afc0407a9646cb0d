"""Shared-memory and register estimates of forward and backward tiles, checked before nvcc runs.

They mirror the static_asserts and kSmemBytes of templates/include/flashgen/mma/fwd_traits.cuh and
bwd_traits.cuh.
"""

from __future__ import annotations

ELEMENT_BYTES = 2  # fp16 and bf16
# fp32 accumulators (O and S) a thread may hold. At 192 (hd128, 128x64, 4 warps) ptxas already
# uses all 255 registers and spills 72-80 bytes; more would spill heavily.
MAX_ACCUMULATOR_REGISTERS = 192
# The forward kernel runs the tiles that need a mask (the diagonal, the ragged end of the keys) in
# a loop of their own, so that the loop over the rest carries no masking code, when the
# accumulators leave ptxas room for that second copy of the loop body. H100, bf16, seqlen 4096
# (docs/performance.md, "Separate masked loop"): separate, hd64 (128 accumulator registers) and
# hd256 (160) ran 1-14% faster; hd128 (192) spilled 204 bytes instead of 64 and ran 7-10% slower.
SEPARATE_MASKED_LOOP_MAX_ACCUMULATORS = 160


def row_chunk(head_dim: int) -> int:
    """Elements per swizzled shared-memory row chunk (the traits' kBlockK)."""
    return 64 if head_dim % 64 == 0 else 32


def padded_head_dim(head_dim: int) -> int:
    chunk = row_chunk(head_dim)
    return -(-head_dim // chunk) * chunk


def smem_bytes(head_dim: int, block_m: int, block_n: int, kv_stages: int) -> int:
    """Q tile plus kv_stages K tiles and kv_stages V tiles."""
    hdp = padded_head_dim(head_dim)
    return ELEMENT_BYTES * hdp * (block_m + 2 * kv_stages * block_n)


def accumulator_registers(head_dim: int, block_m: int, block_n: int, warps: int) -> int:
    """fp32 registers per thread for the O and S accumulators."""
    threads = 32 * warps
    return (block_m * padded_head_dim(head_dim) + block_m * block_n) // threads


def separates_masked_loop(head_dim: int, block_m: int, block_n: int, warps: int) -> bool:
    """Whether the forward kernel gives the masked tiles a loop of their own."""
    return (accumulator_registers(head_dim, block_m, block_n, warps)
            <= SEPARATE_MASKED_LOOP_MAX_ACCUMULATORS)


def tile_problems(head_dim: int, block_m: int, block_n: int, warps: int, kv_stages: int,
                  smem_limit: int) -> list[str]:
    """Why this tile cannot be built, one line per reason; empty when it can."""
    problems = []
    if block_m % (16 * warps):
        problems.append(f"block_m = {block_m} must be a multiple of 16 * warps = {16 * warps}")
    if block_n % 16:
        problems.append(f"block_n = {block_n} must be a multiple of 16")
    problems += _copy_problems(head_dim, block_m, block_n, warps)
    if kv_stages < 2:
        problems.append(f"kv_stages = {kv_stages} must be at least 2")
    problems += _budget_problems(smem_bytes(head_dim, block_m, block_n, kv_stages), smem_limit,
                                 accumulator_registers(head_dim, block_m, block_n, warps))
    return problems


def _copy_problems(head_dim: int, block_m: int, block_n: int, warps: int) -> list[str]:
    """The 16-byte global <-> shared copies cover whole tiles."""
    rows_per_copy = 32 * warps // (row_chunk(head_dim) // 8)
    if rows_per_copy == 0 or block_m % rows_per_copy or block_n % rows_per_copy:
        return [f"block_m = {block_m} and block_n = {block_n} must be multiples of "
                f"{rows_per_copy} (the rows {warps} warps copy at once for head_dim {head_dim})"]
    return []


def _budget_problems(smem: int, smem_limit: int, registers: int) -> list[str]:
    problems = []
    if smem > smem_limit:
        problems.append(f"shared memory {smem} bytes exceeds the arch limit of {smem_limit}")
    if registers > MAX_ACCUMULATOR_REGISTERS:
        problems.append(
            f"{registers} accumulator registers per thread exceed {MAX_ACCUMULATOR_REGISTERS} "
            "(raise warps or lower block_m / block_n)")
    return problems


def warp_split_exists(m: int, n: int, warps: int) -> bool:
    """Whether an (m, n) accumulator splits over a power-of-two grid of `warps` warps in 16 x 16
    granules (tiling.cuh's warps_along_m finds the squarest such split)."""
    splits = [1 << i for i in range(warps.bit_length()) if warps % (1 << i) == 0]
    return any(m % (16 * wm) == 0 and n % (16 * (warps // wm)) == 0 for wm in splits)


def backward_smem_bytes(head_dim: int, block_m: int, block_n: int, q_stages: int) -> int:
    """q_stages Q and dO tiles, K and V, P and dS."""
    hdp = padded_head_dim(head_dim)
    return ELEMENT_BYTES * (2 * q_stages * block_m * hdp + 2 * block_n * hdp + 2 * block_m * block_n)


# Bulk adds of dQ rows pay from this many bytes per row (head dim 64 and up). H100, bf16
# (docs/performance.md, "dQ by bulk reduce-adds on sm_90"): against the atomics, they ran 1.17x
# at head dim 128 and 1.31x at 256, and 1.04-1.07x at head dim 64 on its 128 x 128 tile (on a
# 64 x 128 tile they lost).
DQ_BULK_ADD_MIN_ROW_BYTES = 256


def dq_staging_bytes(head_dim: int, block_m: int) -> int:
    """Shared memory that stages a step's dQ for bulk adds: block_m fp32 rows, 8 floats apart
    (bwd_traits.cuh, kDqRowStride)."""
    return 4 * block_m * (padded_head_dim(head_dim) + 8)


def stages_dq_for_bulk_add(head_dim: int, block_m: int, block_n: int, q_stages: int,
                           arch) -> bool:
    """Whether the backward adds dQ to its workspace by bulk reduce-adds from shared memory
    rather than by per-thread atomics, whose load/store queue stalled every step's barrier:
    where the arch has them, the rows are long enough, and the staging fits."""
    smem = (backward_smem_bytes(head_dim, block_m, block_n, q_stages)
            + dq_staging_bytes(head_dim, block_m))
    return (arch.bulk_reduce and 4 * padded_head_dim(head_dim) >= DQ_BULK_ADD_MIN_ROW_BYTES
            and smem <= arch.smem_limit)


# The backward step is compiled twice, masked and not, when a thread's share of the score tile
# reaches this many elements: left to one copy behind a runtime `if`, ptxas predicates the mask
# (two instructions per score element) into every step. H100, bf16 (docs/performance.md,
# "Mask-free step"): at head dim 64 (128 x 128 tile, 64 scores per thread) the two copies ran
# 1.00-1.05x; at head dim 128 (64 x 128, 32 per thread) the second copy raised the spill from 8
# to 24 bytes and the causal cells ran 0.94-1.01x.
MASK_FREE_STEP_MIN_SCORES = 64


def has_mask_free_step(block_m: int, block_n: int, warps: int) -> bool:
    """Whether the backward step has a copy without masking code for the tiles off the edges."""
    return block_m * block_n // (32 * warps) >= MASK_FREE_STEP_MIN_SCORES


def backward_accumulator_registers(head_dim: int, block_m: int, block_n: int, warps: int) -> int:
    """fp32 registers per thread at the peak: dK and dV (held throughout) plus S and dP, or plus
    a dQ tile, whichever is larger."""
    threads = 32 * warps
    hdp = padded_head_dim(head_dim)
    dk_dv = 2 * block_n * hdp // threads
    return dk_dv + max(2 * block_m * block_n, block_m * hdp) // threads


def backward_tile_problems(head_dim: int, block_m: int, block_n: int, warps: int, q_stages: int,
                           smem_limit: int) -> list[str]:
    """Why this backward tile cannot be built, one line per reason; empty when it can."""
    problems = []
    hdp = padded_head_dim(head_dim)
    if warps & (warps - 1):
        problems.append(f"warps = {warps} must be a power of two")
    if block_n % 32:
        problems.append(f"block_n = {block_n} must be a multiple of 32")
    for what, m, n in (("block_m x block_n", block_m, block_n),
                       ("block_n x head_dim", block_n, hdp), ("block_m x head_dim", block_m, hdp)):
        if not warps & (warps - 1) and not warp_split_exists(m, n, warps):
            problems.append(f"{what} = {m} x {n} does not split over {warps} warps in 16 x 16 "
                            f"tiles")
    problems += _copy_problems(head_dim, block_m, block_n, warps)
    if q_stages not in (1, 2):
        problems.append(f"q_stages = {q_stages} must be 1 or 2")
    problems += _budget_problems(backward_smem_bytes(head_dim, block_m, block_n, q_stages),
                                 smem_limit,
                                 backward_accumulator_registers(head_dim, block_m, block_n, warps))
    return problems
