"""What a Hopper tile costs, checked before nvcc: the same budgets the static_asserts of
templates/include/flashgen/hopper/fwd_traits.cuh and bwd_traits.cuh enforce, with messages that say
what to change."""

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


def shared_bytes(head_dim: int, block_m: int, block_n: int, kv_stages: int,
                 fp8: bool = False) -> int:
    """Q (reused for O), the K and V rings, and their barriers (each ring's full and empty per
    stage, Q's full and free, the tile handoff's four and its two indices); fp8: one-byte Q, K
    and V, and O in a buffer of its own (16-bit, twice Q's bytes)."""
    element_bytes = 1 if fp8 else ELEMENT_BYTES
    q = _align(block_m * head_dim * element_bytes)
    ring = _align(kv_stages * block_n * head_dim * element_bytes)
    barriers = 2 * 2 * 8 * kv_stages + 2 * 8 + 4 * 8 + 2 * 4
    out = _align(block_m * head_dim * ELEMENT_BYTES) if fp8 else 0
    return q + 2 * ring + out + barriers


def accumulator_registers(head_dim: int, block_n: int, fp8: bool = False) -> int:
    """Per consumer thread: S (64 x block_n fp32), P (16-bit, or 8-bit with fp8) and O (64 x
    head_dim fp32) over 128 threads."""
    return block_n // 2 + block_n // (8 if fp8 else 4) + head_dim // 2


def tile_problems(head_dim: int, block_m: int, block_n: int, kv_stages: int,
                  smem_limit: int, fp8: bool = False) -> list[str]:
    """fp8: an e4m3 forward's tile (fwd_traits.cuh's kFp8), whose GEMMs step k by 32 bytes."""
    problems = []
    if fp8 and (head_dim % 32 or block_n % 32):
        problems.append(f"head_dim {head_dim}, block_n {block_n}: an fp8 forward needs multiples "
                        f"of 32 (an 8-bit wgmma's k step, over the head dim in QK^T and the keys "
                        f"in PV)")
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
    smem = shared_bytes(head_dim, block_m, block_n, kv_stages, fp8)
    if smem > smem_limit:
        problems.append(f"needs {smem} bytes of shared memory, more than the {smem_limit} a block "
                        f"may use: lower block_n or kv_stages")
    budget = CONSUMER_REGISTERS[block_m // 64] - REGISTER_OVERHEAD
    needed = accumulator_registers(head_dim, block_n, fp8)
    if needed > budget:
        problems.append(f"needs about {needed} accumulator registers per consumer thread, more than "
                        f"the {budget} its {block_m // 64} warpgroup(s) leave: lower block_n (or "
                        f"block_m, for more registers per warpgroup)")
    return problems


# The backward (bwd_traits.cuh): registers per consumer thread after setmaxnreg, by consumer
# warpgroups (64 keys each).
BACKWARD_CONSUMER_REGISTERS = {1: 256, 2: 240}
# Besides the accumulators: descriptors, indices, the lse and D reads. An allowance, not a
# measurement: the default tiles (192 accumulator registers by the model below) compile without
# spills under it.
BACKWARD_REGISTER_OVERHEAD = 16


# The head dims above 128 whose halves are whole 32-column swizzle atoms and a wgmma's n without
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (BASE_WGMMA_N: 96 and 128).
SPLIT_HEAD_DIMS = (192, 256)


def backward_splits_head_dim(head_dim: int) -> bool:
    """Above head dim 128 one consumer's 64 keys' dK and dV (64 x head_dim fp32 each) exceed its
    registers: two consumer warpgroups share the block's 64 keys and split the head dim's columns
    of dK, dV and dQ, P^T joining dS^T in shared memory (bwd_traits.cuh's kSplitHeadDim)."""
    return head_dim > 128


def backward_atom_cols(head_dim: int) -> int:
    """Columns of the swizzle atom of the K, V, Q and dO tiles: the widest (64, 32, 16 or 8
    16-bit columns) that divides a consumer's share of the head dim (bwd_traits.cuh's Atom)."""
    share = head_dim // 2 if backward_splits_head_dim(head_dim) else head_dim
    return next(cols for cols in (64, 32, 16, 8) if share % cols == 0)


def backward_dq_share_cols(head_dim: int, block_m: int, block_n: int) -> tuple[int, ...]:
    """Head-dim columns of each consumer's dQ share (bwd_traits.cuh's dq_cols): the whole head dim
    where a share is 64 query rows (block_m = 64 x consumers) or the block has one consumer, else
    whole swizzle atoms, the first consumer's the larger half where they do not halve (head dim
    96: 64 and 32; head dim 64 at block_m 64 would leave the second consumer none)."""
    consumers = backward_consumers(head_dim, block_n)
    if consumers == 1 or block_m == 64 * consumers:
        return (head_dim,) * consumers
    atom = backward_atom_cols(head_dim)
    first = (head_dim // atom + 1) // 2 * atom
    return first, head_dim - first


def backward_consumers(head_dim: int, block_n: int) -> int:
    """Consumer warpgroups of a backward block: one per 64 keys, or two splitting the head dim."""
    return 2 if backward_splits_head_dim(head_dim) else block_n // 64


def backward_shared_bytes(head_dim: int, block_m: int, block_n: int, q_stages: int,
                          do_stages: int, dq_buffers: int, dq_pieces: int) -> int:
    """K and V, the Q and dO rings, two dS buffers (and two for P, split by the head dim), dQ's
    fp32 staging (dq_buffers of block_m x head_dim / dq_pieces over the consumers), each stage's
    lse and D, and the barriers."""
    kv = 2 * _align(block_n * head_dim * ELEMENT_BYTES)
    rings = (_align(q_stages * block_m * head_dim * ELEMENT_BYTES)
             + _align(do_stages * block_m * head_dim * ELEMENT_BYTES))
    ds_buffers = 4 if backward_splits_head_dim(head_dim) else 2
    ds = _align(ds_buffers * block_m * block_n * ELEMENT_BYTES)
    dq = dq_buffers * block_m * head_dim * 4 // dq_pieces  # the shares tile the query block
    stats = (q_stages + do_stages) * block_m * 4
    barriers = 2 * 8 * (q_stages + do_stages) + 8
    return kv + rings + ds + dq + stats + barriers


def backward_memory_plan(head_dim: int, block_m: int, block_n: int, q_stages: int,
                         smem_limit: int) -> tuple[int, int, int]:
    """(dO's stages, dQ staging buffers per consumer, pieces a share is staged in): the first that
    fits of dO's ring as deep as Q's with two buffers, with one, then one dO stage, then the
    share staged in two halves (bwd_traits.cuh's kDoStages, kDqBuffers, kDqPieces). Split by the
    head dim, where only deterministic runs stage dQ: dO's ring as deep as Q's, then one buffer
    if it fits beside it, else none (those runs' consumers add from registers in turn)."""
    def fits(do_stages, dq_buffers, dq_pieces):
        return backward_shared_bytes(head_dim, block_m, block_n, q_stages, do_stages, dq_buffers,
                                     dq_pieces) <= smem_limit
    if backward_splits_head_dim(head_dim):
        dq_buffers = 1 if fits(q_stages, 1, 1) else 0
    else:
        dq_buffers = 2 if fits(q_stages, 2, 1) else 1
    do_stages = q_stages if fits(q_stages, dq_buffers, 1) else 1
    return do_stages, dq_buffers, 1 if fits(do_stages, dq_buffers, 1) else 2


def backward_accumulator_registers(head_dim: int, block_m: int, block_n: int) -> int:
    """Per consumer thread (64 keys, 128 threads): dK and dV (64 x head_dim fp32 each) throughout;
    at the softmax S^T and dP^T (64 x block_m fp32 each), converted in place to 16-bit P^T and
    dS^T, which then live beside dQ's share (64 rows x its columns, fp32). Split by the head dim:
    dK and dV of half the columns; S^T and dP^T of half the rows, gone to shared memory before
    dQ's share (64 x half the columns) exists."""
    if backward_splits_head_dim(head_dim):
        return head_dim // 2 + max(block_m // 2 + block_m // 4, 64 * head_dim // 2 // 128)
    split_rows = block_m == 64 * (block_n // 64)
    dq_cols = max(backward_dq_share_cols(head_dim, block_m, block_n))
    dq = (64 if split_rows else block_m) * dq_cols // 128
    return head_dim + max(block_m, block_m // 2 + dq)


def backward_tile_problems(head_dim: int, block_m: int, block_n: int, q_stages: int,
                           smem_limit: int) -> list[str]:
    problems = []
    if head_dim % 16 or head_dim > 256:
        problems.append(f"head_dim {head_dim}: the hopper family needs a multiple of 16 up to 256")
    if block_n not in (64, 128):
        problems.append(f"block_n = {block_n}: one consumer warpgroup per 64 keys, so 64 or 128")
    if block_m % 16 or not 64 <= block_m <= 128:
        problems.append(f"block_m = {block_m}: a multiple of 16 from 64 to 128 (the S^T and dP^T "
                        f"GEMMs' n, dV's and dK's k)")
    if q_stages < 1:
        problems.append(f"q_stages = {q_stages}: at least 1")
    if problems:
        return problems
    consumers = backward_consumers(head_dim, block_n)
    if backward_splits_head_dim(head_dim):
        if head_dim not in SPLIT_HEAD_DIMS or block_n != 64 or block_m != 64:
            problems.append(f"head_dim {head_dim}, block_m = {block_m}, block_n = {block_n}: above "
                            f"128 two consumer warpgroups share 64 keys (block_n = 64) of 64 query "
                            f"rows (block_m = 64) and split the head dim in halves of whole "
                            f"32-column swizzle atoms, each one wgmma's n, so head_dim 192 or 256 "
                            f"only; without a backward table a head dim's gradients run on the mma "
                            f"family")
    elif block_m % 64 and head_dim != 64 * consumers:
        problems.append(f"block_m = {block_m}, block_n = {block_n}: a block_m that is no multiple "
                        f"of 64 computes dQ transposed, 64 head-dim columns per consumer "
                        f"warpgroup, so head_dim must be {64 * consumers}")
    elif block_m % 64 == 0 and block_m != 64 * consumers and (
            block_m != 64 or 0 in backward_dq_share_cols(head_dim, block_m, block_n)):
        atom = backward_atom_cols(head_dim)
        problems.append(f"block_m = {block_m}, block_n = {block_n}: dQ splits over the {consumers} "
                        f"consumer warpgroup(s) by 64 query rows (block_m = {64 * consumers}) or, "
                        f"with block_m = 64, by head-dim columns in whole {atom}-column swizzle "
                        f"atoms, at least one each (head_dim {head_dim} has "
                        f"{head_dim // atom}): use block_m = {64 * consumers}")
    smem = backward_shared_bytes(head_dim, block_m, block_n, q_stages,
                                 *backward_memory_plan(head_dim, block_m, block_n, q_stages,
                                                       smem_limit))
    if smem > smem_limit:
        problems.append(f"needs {smem} bytes of shared memory, more than the {smem_limit} a block "
                        f"may use: lower q_stages or block_m")
    budget = BACKWARD_CONSUMER_REGISTERS[consumers] - BACKWARD_REGISTER_OVERHEAD
    needed = backward_accumulator_registers(head_dim, block_m, block_n)
    if needed > budget:
        problems.append(f"needs about {needed} accumulator registers per consumer thread, more than "
                        f"the {budget} its {consumers} warpgroup(s) leave: lower block_m")
    return problems
