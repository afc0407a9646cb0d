"""The hopper family: the forward on wgmma + TMA for sm_90a (warp specialised, FlashAttention-3's
design).

One thread block per block_m query rows: a producer warp loads Q once and streams K and V by TMA
through rings of kv_stages buffers; consumer warpgroups (one per 64 rows) run QK^T and PV on
wgmma, taking turns on the tensor cores (pingpong) and issuing the next tile's QK^T before this
tile's softmax (overlap). Where shared memory leaves room for an output buffer, calls run on a
persistent grid (one block per SM walking tiles) that loads each next tile's Q under the last
one's output: tiles dealt out statically without a mask, claimed in order from a counter under a
causal mask.

The backward (FlashAttention-2's algorithm on the same units): one thread block per block_n keys
of a (batch, KV head), K and V held in shared memory and dK, dV in the consumer warpgroups'
registers (64 keys each; above head dim 128 two warpgroups share 64 keys and split the head
dim), Q and dO of each query block of the group's heads streamed by TMA
through rings of q_stages buffers, each step's dQ shares staged in shared memory and added to an
fp32 workspace by a dQ warp with the copy engine's bulk reduce-add (deterministic: in turn; split
by the head dim the consumers add them from registers instead, deterministic runs too where no
staging buffer fits, in turn). A
variable-length batch runs as a dense batch of its longest lengths, each block reading its
sequence's offsets (blocks past a shorter sequence exit). Templates in
templates/hopper/, headers in templates/include/flashgen/hopper/; resources.py mirrors their
budgets.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.family import Family, Kind, Tile
from codegen.families.hopper import resources
from codegen.paths import TEMPLATES_DIR


@dataclass(frozen=True, order=True)
class FwdTile(Tile):
    SUFFIX = ("m", "n", "s", "p", "o")
    block_m: int    # query rows per thread block: 64 per consumer warpgroup (64, 128 or 192)
    block_n: int    # key rows per K/V stage (a multiple of 16, at most 256)
    kv_stages: int  # K and V tiles in flight in the TMA rings (>= 2)
    pingpong: bool  # the consumer warpgroups take turns issuing their GEMMs
    overlap: bool   # a warpgroup issues the next QK^T before this tile's softmax


@dataclass(frozen=True, order=True)
class BwdTile(Tile):
    SUFFIX = ("m", "n", "s", "d")
    block_m: int    # query rows per step (a multiple of 16, 64 to 128; no multiple of 64: dQ^T)
    block_n: int    # keys per thread block, 64 per consumer warpgroup (64 or 128)
    q_stages: int   # Q and dO tiles in flight in the TMA rings (>= 1)
    dq_before_dk: bool  # dQ's GEMM goes ahead of dK's, whose run hides the issue of dQ's adds


def _fwd_problems(head_dim: int, tile: FwdTile, arch) -> list[str]:
    return resources.tile_problems(head_dim, tile.block_m, tile.block_n, tile.kv_stages,
                                   arch.smem_limit)


def _fp8_problems(head_dim: int, tile: FwdTile, arch) -> list[str]:
    return resources.tile_problems(head_dim, tile.block_m, tile.block_n, tile.kv_stages,
                                   arch.smem_limit, fp8=True)


def _bwd_problems(head_dim: int, tile: BwdTile, arch) -> list[str]:
    return resources.backward_tile_problems(head_dim, tile.block_m, tile.block_n, tile.q_stages,
                                            arch.smem_limit)


def template_context(spec) -> dict:
    """CuTe offers wgmma's n in steps of 8 only with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED;
    without it a 176-key tile would run as eleven n = 16 instructions, each rereading Q from
    shared memory (the traits assert one instruction per GEMM). The backward's GEMMs have n =
    head_dim (dK, dV), block_m and dQ's shares' columns."""
    if spec.kind in ("fwd", "fwd_fp8"):
        ns = (spec.tile.block_n,)
    else:
        tile = spec.tile
        ns = (tile.block_m,
              *resources.backward_dq_share_cols(spec.head_dim, tile.block_m, tile.block_n))
    return {"extended_wgmma_shapes": any(resources.needs_extended_wgmma_shapes(spec.head_dim, n)
                                         for n in ns)}


FAMILY = Family(
    name="hopper",
    archs=("sm_90",),
    # Ahead of the mma family (100): on an H100 it runs the forward whenever it is built.
    priority=50,
    # Alt tiles are short-sequence tiles (flashgen/families/hopper/).
    kinds=(Kind("fwd", table=None, tile=FwdTile, template="fwd_kernel.cu.j2",
                problems=_fwd_problems, alt_tiles=True),
           # q, k, v in e4m3 with descales (the dtype is the output's), forward only: where
           # a head dim's table has an fp8 subtable (flashgen/fp8.py).
           Kind("fwd_fp8", table="fp8", tile=FwdTile, template="fwd_kernel.cu.j2",
                problems=_fp8_problems, required=False),
           # Without a backward table, that head dim's gradients run on the mma family.
           Kind("bwd", table="backward", tile=BwdTile, template="bwd_kernel.cu.j2",
                problems=_bwd_problems, required=False)),
    template_dir=TEMPLATES_DIR / "hopper",
    # wgmma and setmaxnreg exist only in the arch-specific target.
    gencode=lambda arch: "-gencode=arch=compute_90a,code=sm_90a",
    # ptxas warns (C7510) when it must serialise wgmma across a call or a branch it cannot
    # prove warpgroup-uniform, which costs 20-25%: a build failure, not a slow kernel.
    nvcc_flags=("-Xptxas=--warning-as-error",),
    template_context=template_context,
    tma_inputs=True,
    tile_counter=True,
    varlen_forward=True,
    varlen_backward=True,
    dropout_kinds=("fwd", "bwd"),
    cache_forward=True,
)
