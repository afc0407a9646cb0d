"""What a Hopper forward tile costs, checked before nvcc: the same budgets the static_asserts of
templates/include/flashgen/hopper/fwd_traits.cuh enforce, with messages that say what to change."""

from __future__ import annotations

ELEMENT_BYTES = 2
# Registers per consumer thread after setmaxnreg, by consumer warpgroups (fwd_traits.cuh).
CONSUMER_REGISTERS = {1: 256, 2: 240, 3: 160}
# What a consumer thread holds besides its accumulators (descriptors, indices, softmax state),
# measured from ptxas reports of the default tiles.
REGISTER_OVERHEAD = 24


# The wgmma n that CuTe's op selectors give without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (then
# any multiple of 8 up to 256); that macro pulls in headers that add about 30% to a kernel's
# compile time, so only tiles that need it define it.
BASE_WGMMA_N = (8, 16, 32, 64, 96, 128, 192, 256)


def needs_extended_wgmma_shapes(head_dim: int, block_n: int) -> bool:
    """Whether QK^T (n = block_n) or PV (n = head_dim) needs a wgmma n outside BASE_WGMMA_N."""
    return block_n not in BASE_WGMMA_N or head_dim not in BASE_WGMMA_N


def _align(n: int, to: int = 1024) -> int:
    return -(-n // to) * to


def shared_bytes(head_dim: int, block_m: int, block_n: int, kv_stages: int) -> int:
    """Q (reused for O), the K and V rings, and their barriers (each ring's full and empty per
    stage, Q's full and free, the tile handoff's four and its two indices)."""
    q = _align(block_m * head_dim * ELEMENT_BYTES)
    ring = _align(kv_stages * block_n * head_dim * ELEMENT_BYTES)
    barriers = 2 * 2 * 8 * kv_stages + 2 * 8 + 4 * 8 + 2 * 4
    return q + 2 * ring + barriers


def accumulator_registers(head_dim: int, block_n: int) -> int:
    """Per consumer thread: S (64 x block_n fp32), P (16-bit) and O (64 x head_dim fp32) over 128
    threads."""
    return block_n // 2 + block_n // 4 + head_dim // 2


def tile_problems(head_dim: int, block_m: int, block_n: int, kv_stages: int,
                  smem_limit: int) -> list[str]:
    problems = []
    if head_dim % 16 or head_dim > 256:
        problems.append(f"head_dim {head_dim}: the hopper family needs a multiple of 16 up to 256 "
                        f"(wgmma's k step); configure the next multiple of 16 and calls pad to it")
    if block_m not in (64, 128, 192):
        problems.append(f"block_m = {block_m}: one consumer warpgroup per 64 rows, so 64, 128 or "
                        f"192")
    if block_n % 16 or not 16 <= block_n <= 256:
        problems.append(f"block_n = {block_n}: a multiple of 16 from 16 to 256 (one wgmma's n)")
    if kv_stages < 2:
        problems.append(f"kv_stages = {kv_stages}: at least 2, or TMA never runs ahead")
    if problems:
        return problems
    smem = shared_bytes(head_dim, block_m, block_n, kv_stages)
    if smem > smem_limit:
        problems.append(f"needs {smem} bytes of shared memory, more than the {smem_limit} a block "
                        f"may use: lower block_n or kv_stages")
    budget = CONSUMER_REGISTERS[block_m // 64] - REGISTER_OVERHEAD
    needed = accumulator_registers(head_dim, block_n)
    if needed > budget:
        problems.append(f"needs about {needed} accumulator registers per consumer thread, more than "
                        f"the {budget} its {block_m // 64} warpgroup(s) leave: lower block_n (or "
                        f"block_m, for more registers per warpgroup)")
    return problems
