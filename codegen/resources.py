"""Shared-memory and register estimates of a forward tile, checked before nvcc ever runs.

They mirror the static_asserts and kSmemBytes of templates/include/flashgen/fwd_traits.cuh.
"""

from __future__ import annotations

ELEMENT_BYTES = 2  # fp16 and bf16
# fp32 accumulators (O and S) a thread may hold. At 192 (hd128, 128x64, 4 warps) ptxas already
# uses all 255 registers and spills 72-80 bytes (notes/perf.md); more would spill heavily.
MAX_ACCUMULATOR_REGISTERS = 192


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


def tile_problems(head_dim: int, block_m: int, block_n: int, warps: int, kv_stages: int,
                  smem_limit: int) -> list[str]:
    """Why this tile cannot be built, one line per reason; empty when it can."""
    problems = []
    threads = 32 * warps
    rows_per_copy = threads // (row_chunk(head_dim) // 8)
    if block_m % (16 * warps):
        problems.append(f"block_m = {block_m} must be a multiple of 16 * warps = {16 * warps}")
    if block_n % 16:
        problems.append(f"block_n = {block_n} must be a multiple of 16")
    if rows_per_copy == 0 or block_m % rows_per_copy or block_n % rows_per_copy:
        problems.append(
            f"block_m = {block_m} and block_n = {block_n} must be multiples of {rows_per_copy} "
            f"(the rows {warps} warps copy at once for head_dim {head_dim})")
    if kv_stages < 2:
        problems.append(f"kv_stages = {kv_stages} must be at least 2")
    smem = smem_bytes(head_dim, block_m, block_n, kv_stages)
    if smem > smem_limit:
        problems.append(f"shared memory {smem} bytes exceeds the arch limit of {smem_limit}")
    regs = accumulator_registers(head_dim, block_m, block_n, warps)
    if regs > MAX_ACCUMULATOR_REGISTERS:
        problems.append(
            f"{regs} accumulator registers per thread exceed {MAX_ACCUMULATOR_REGISTERS} "
            "(raise warps or lower block_m / block_n)")
    return problems
