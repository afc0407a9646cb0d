"""What the bench measures: the implementations, the modes, the grid's shapes and the FLOPs
each cell counts (FlashAttention's convention, see the package's docstring)."""

from __future__ import annotations

import math

TOKENS = 16384
HIDDEN = 2048
# FlashAttention-4 (flash-attn-4's flash_attn.cute, on (batch, seq, heads, dim) as flashgen): timed
# where it is importable, "unsupported" with the reason where it is not.
FA4 = "FA4"
IMPLEMENTATIONS = ("flashgen", "FLASH_ATTENTION", "CUDNN_ATTENTION", FA4, "EFFICIENT_ATTENTION",
                   "MATH")
# Timed only when asked for (--impl): what deterministic=True costs flashgen's backward, and
# flashgen's mma forward on one tile whatever the shape (flashgen.families.mma.pinned_forward_tile):
# the main tile, or the head dim's first alt tile.
PINNED_TILES = {"flashgen_main_tile": 0, "flashgen_alt_tile": 1}
# flashgen with the forward on one kernel family ($FLASHGEN_FAMILY), whatever dispatch prefers.
FAMILY_IMPLEMENTATIONS = {"flashgen_mma": "mma", "flashgen_hopper": "hopper"}
# flashgen's e4m3 forward (flashgen/fp8.py) on the cell's inputs cast to float8_e4m3fn (no
# descales) before timing; its output is the cell's dtype. Forward only.
FP8 = "flashgen_e4m3"
OPTIONAL_IMPLEMENTATIONS = ("flashgen_deterministic", *PINNED_TILES, *FAMILY_IMPLEMENTATIONS,
                            FP8)
KNOWN_IMPLEMENTATIONS = IMPLEMENTATIONS + OPTIONAL_IMPLEMENTATIONS
PEER = "FLASH_ATTENTION"  # FlashAttention-2: the ratio column
MAIN_TILE = "flashgen_main_tile"  # when timed, a column of what the shape-aware choice gains
DEFAULT_GRID = {"dtypes": ("bf16", "fp16"), "head_dims": (64, 128, 256),
                "seqlens": (512, 1024, 2048, 4096, 8192, 16384), "causal": (False, True)}
MODES = ("fwd", "bwd", "fwd_bwd")
DEFAULT_MODES = ("fwd", "bwd")
MODE_NAMES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}  # FlashAttention's count, per forward


def forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal) -> float:
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def mode_flops(mode: str, batch, heads, seqlen_q, seqlen_k, head_dim, causal) -> float:
    return FLOP_FACTOR[mode] * forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal)


def grid_shape(seqlen: int, head_dim: int, batch: int | None = None,
               heads: int | None = None) -> tuple[int, int]:
    """(batch, heads) for the convention above; a given batch or heads replaces the
    convention's."""
    return batch or max(1, TOKENS // seqlen), heads or max(1, HIDDEN // head_dim)


def input_sets(set_bytes: int, l2_bytes: int) -> int:
    """Enough input sets that rotating through them defeats L2 (at most 8)."""
    return max(1, min(8, math.ceil(4 * l2_bytes / max(1, set_bytes))))
