"""Config-defined variants at call time (codegen/variants.py), below the torch ops: resolving
variant="name" against the active config, and the block mask of a variant's mask_mod: which keys
each group of 16 query rows may see, and which 16-key groups it sees some or all of
(common/variant.cuh), per sequence, and per query head where the mask_mod reads h, computed on the
GPU by evaluating mask_mod at every (query, key) pair (an O(seqlen_q * seqlen_k) pass). Decode
calls compute none: their kernels run the mask_mod on every cached key. A public call's variant
arguments and flashgen.block_mask: flashgen/variant_args.py."""

from __future__ import annotations

import torch

from codegen import params
from codegen.variants import Variant
from flashgen import host, loader, registry
from flashgen.modifiers import Modifiers

MASK_RANGE_ROWS = 16  # common/variant.cuh's kMaskRangeRows
MASK_RANGE_INTS = 4   # and the ints of its MaskRange (kMaskRangeInts)
MAX_BITMAP_WORDS = 48 * 1024 // 8  # a group of rows' two bitmaps are built in shared memory
MAX_MASKS = 65535  # block masks per call (sequences x heads): the kernels' grid.y


def mask_block_words(seqlen_k: int) -> int:
    """common/variant.cuh's mask_block_words: one bit per 16 keys, a spare word, 16-byte rows."""
    key_groups = -(-seqlen_k // MASK_RANGE_ROWS)
    return (-(-key_groups // 32) + 1 + 3) // 4 * 4


def block_mask_shape(variant: Variant, batch: int, heads: int, seqlen_q: int,
                     seqlen_k: int) -> tuple[int, int, int, int]:
    """(batch, heads or 1, groups of 16 query rows, ints per group): a mask per sequence, and per
    query head where the variant's mask_mod reads h; each group's MaskRange, then its bitmaps of
    the groups of 16 keys it sees any of and those it sees whole."""
    return (batch, heads if variant.per_head else 1, -(-seqlen_q // MASK_RANGE_ROWS),
            MASK_RANGE_INTS + 2 * mask_block_words(seqlen_k))


def resolve(name) -> Variant:
    """The active config's variant `name`; ValueError naming the configured ones otherwise."""
    config = registry.active_config()
    variant = config.variant(name) if isinstance(name, str) else None
    if variant is None:
        known = ", ".join(v.name for v in config.variants) or "none"
        raise ValueError(f"flashgen: variant={name!r} is not defined by {config.path} "
                         f"(configured variants: {known}); add a [variants.<name>] table "
                         f"(codegen/variants.py)")
    return variant


def compute_mask_ranges(variant: Variant, q, k, tensors: tuple, varlen: tuple,
                        launcher: loader.Launcher) -> torch.Tensor:
    """Runs the variant's mask-range kernels (in launcher's library: every kernel of a variant
    with a mask_mod carries them) for q, k as passed to the forward."""
    batch, seqlen_q, seqlen_k, sequences = host.problem_sizes(q, k, varlen)
    if mask_block_words(seqlen_k) > MAX_BITMAP_WORDS:
        raise ValueError(f"flashgen: variant {variant.name!r}'s block mask covers at most "
                         f"{(MAX_BITMAP_WORDS - 4) * 32 * MASK_RANGE_ROWS} keys, got seqlen_k "
                         f"{seqlen_k}")
    shape = block_mask_shape(variant, batch, q.shape[2], seqlen_q, seqlen_k)
    if shape[0] * shape[1] > MAX_MASKS:
        raise ValueError(f"flashgen: variant {variant.name!r} needs {shape[0] * shape[1]} block "
                         f"masks (sequences x heads), at most {MAX_MASKS}: split the batch")
    ranges = torch.empty(shape, dtype=torch.int32, device=q.device)
    if ranges.numel() == 0:
        return ranges
    fields = Modifiers(variant=variant, variant_tensors=tensors, mask_ranges=ranges).fields(1.0)
    args = params.attention_args(q=q, k=k, v=k, batch=batch, heads=q.shape[2], heads_kv=k.shape[2],
                                 seqlen_q=seqlen_q, seqlen_k=seqlen_k, **fields, **sequences)
    host.call_on_device(loader.binding().attention, q.get_device(),
                        (launcher.mask_ranges_address, launcher.error_string_address, *args))
    return ranges
