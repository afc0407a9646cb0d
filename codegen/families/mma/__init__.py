"""The mma family: FlashAttention-2's design on mma.sync + ldmatrix + cp.async (sm_80 and up).

Forward: one thread block per block_m query rows, K/V streaming through a ring of kv_stages
cp.async buffers. Backward: one thread block per block_n keys, Q/dO streaming through q_stages
buffers, dQ added to an fp32 workspace. Decode: attention over a KV cache (contiguous or paged),
the query heads of a KV head packed into the tile's rows, the keys split over several blocks and
combined; the forward's tile keys and traits. Templates in templates/mma/, headers in
templates/include/flashgen/mma/; resources.py mirrors the headers' static_asserts.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.arch import ARCHS
from codegen.family import Family, Kind, Tile
from codegen.families.mma import resources
from codegen.paths import TEMPLATES_DIR


@dataclass(frozen=True, order=True)
class FwdTile(Tile):
    SUFFIX = ("m", "n", "w", "s")
    block_m: int    # query rows per thread block (a multiple of 16 * warps)
    block_n: int    # key rows per pipeline stage (a multiple of 16)
    warps: int      # 16 query rows per warp per MMA step
    kv_stages: int  # K/V tiles in flight in the cp.async ring (>= 2)


@dataclass(frozen=True, order=True)
class BwdTile(Tile):
    SUFFIX = ("m", "n", "w", "s")
    block_m: int    # query rows per step
    block_n: int    # key rows per thread block (a multiple of 32)
    warps: int      # a power of two; each GEMM splits them over a 2-D grid
    q_stages: int   # Q/dO tiles in flight (1 or 2)


def _fwd_problems(head_dim: int, tile: FwdTile, arch) -> list[str]:
    return resources.tile_problems(head_dim, tile.block_m, tile.block_n, tile.warps,
                                   tile.kv_stages, arch.smem_limit)


def _bwd_problems(head_dim: int, tile: BwdTile, arch) -> list[str]:
    return resources.backward_tile_problems(head_dim, tile.block_m, tile.block_n, tile.warps,
                                            tile.q_stages, arch.smem_limit)


def template_context(spec) -> dict:
    """The compile-time choices each kind's traits take beyond the tile (resources.py decides)."""
    t = spec.tile
    if spec.kind == "fwd":
        return {"separate_masked_loop": resources.separates_masked_loop(
            spec.head_dim, t.block_m, t.block_n, t.warps)}
    if spec.kind != "bwd":
        return {}
    return {"dq_bulk_reduce": resources.stages_dq_for_bulk_add(spec.head_dim, t.block_m, t.block_n,
                                                               t.q_stages, ARCHS[spec.arch]),
            "mask_free_step": resources.has_mask_free_step(t.block_m, t.block_n, t.warps)}


FAMILY = Family(
    name="mma",
    archs=("sm_80", "sm_86", "sm_89", "sm_90"),
    priority=100,
    kinds=(
        Kind("fwd", table=None, tile=FwdTile, template="fwd_kernel.cu.j2",
             problems=_fwd_problems, alt_tiles=True),
        # Without a backward table, gradients of a head dim run zero-padded on the next larger
        # head dim that has one.
        Kind("bwd", table="backward", tile=BwdTile, template="bwd_kernel.cu.j2",
             problems=_bwd_problems, required=False),
        # The KV-cache kernels of flash_attn_with_kvcache (split-KV decode, and chunked prefill on
        # an alt tile for calls with many query rows: flashgen/decode.py); only the head dims
        # whose table has a `.kvcache` subtable have them.
        Kind("kvcache", table="kvcache", tile=FwdTile, template="kvcache_kernel.cu.j2",
             problems=_fwd_problems, required=False, alt_tiles=True),
    ),
    template_dir=TEMPLATES_DIR / "mma",
    template_context=template_context,
    varlen_forward=True,
    varlen_backward=True,
    dropout_kinds=("fwd", "bwd"),
    bias_gradient=True,
)
