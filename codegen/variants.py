"""Config-defined attention variants: a table of the config names a variant and gives C++ for a
mask (`mask_mod(b, h, q_idx, kv_idx) -> bool`) and/or a score modifier (`score_mod(score, b, h,
q_idx, kv_idx) -> score` with its gradient), plus the tensors they read. Each renders into one
struct (common/variant.cuh's VariantMask and VariantScore wrap it) that the kernels of the variant
compile in, so a variant costs nothing where it is absent.

    [variants.document]
    tensors = { doc_ids = "int32[batch, seqlen_k]" }   # name = "dtype[dims]", at most 4
    mask_mod = "(doc_ids(b, q_idx) == doc_ids(b, kv_idx)) & (kv_idx <= q_idx)"
    head_dims = [64, 128]                              # optional: which head dims build it
    # skip_blocks = true: the mask's visible keys per row may have holes (block-sparse); kernels
    # then skip the tiles inside a row's key range that it hides (optional, default false)
    # dropout = true: its forward and backward kernels are built a second time with dropout, for
    # calls with dropout_p > 0 (optional, default false; doubles its kernels)
    # kvcache = true: KV-cache kernels too, for flash_attn_with_kvcache (optional, default false)

A snippet is a C++ expression, or a function body with its own `return`s. In scope: b (the
sequence), h (the query head), q_idx and kv_idx (positions within the sequence: in decode
kernels a new token's q_idx counts the cached keys before it), each tensor as an accessor
(`name(i, j)`, `name.size(d)`), and for score_mod and score_mod_grad `score`: the scaled score
q.k * softmax_scale for score_mod, the modified score for score_mod_grad, which returns
d score_mod / d score ("1" for a bias: the backward then skips it). Snippets are called at
positions inside the sequence (a tile's padding runs them on the nearest such position and
drops the answer; a sequence without queries may pass q_idx -1). A mask_mod that reads h gets
block masks per (sequence, query head), which cost heads times the memory and time to build (a
sequence's heads share one otherwise). Tensor dims named batch, heads, heads_kv, seqlen_q or
seqlen_k (in decode: the cache's capacity), written as numbers, or as such a name over a number
(seqlen_q/128: the count of 128-row blocks, rounded up) are checked per call; other names are
free.

Snippets run on every element of a masked tile (a score_mod on every score): join a mask's
conditions with & and |, not && and ||. Then no branch splits a tile's elements, and the compiler
issues the tensor reads together and once per value a thread's elements share (a row's, a
column's); the short-circuit forms give each element its own branch and wait. A tensor read is
clamped into the tensor, so a read that a && would have guarded is safe to evaluate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from codegen.masks import MASKS, MaskKind
from codegen.score_mods import SCORE_MODS, ScoreModKind

# The element types a variant tensor may have: config name -> (C++ type, torch dtype name).
DTYPES = {"int32": ("int32_t", "int32"), "int64": ("int64_t", "int64"),
          "float32": ("float", "float32")}
CHECKED_DIMS = ("batch", "heads", "heads_kv", "seqlen_q", "seqlen_k")
MAX_TENSORS = 4  # params.h's variant_tensor slots
MAX_RANK = 4
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TENSOR = re.compile(r"\s*(\w+)\s*\[([^\]]*)\]\s*")
_RESERVED = {"b", "h", "q_idx", "kv_idx", "score", "p", *CHECKED_DIMS}
_UNIT = re.compile(r"\s*1(\.0*)?f?\s*")
_BLOCKS = re.compile(r"(\w+)\s*/\s*([1-9][0-9]*)")  # a checked dim in blocks of a number
_READS_HEAD = re.compile(r"\bh\b")


class VariantError(ValueError):
    """A variant table that cannot be built; the message names the table."""


@dataclass(frozen=True, order=True)
class VariantTensor:
    name: str
    dtype: str                # a key of DTYPES
    dims: tuple[str, ...]     # CHECKED_DIMS names, numbers (as text) or free names

    @property
    def cpp_type(self) -> str:
        return DTYPES[self.dtype][0]

    def expected_shape(self, sizes: dict) -> tuple:
        """The size each dim must have in a call whose CHECKED_DIMS are `sizes` (None: free)."""
        def size(dim: str):
            if dim.isdigit():
                return int(dim)
            if dim in CHECKED_DIMS:
                return sizes[dim]
            blocks = _BLOCKS.fullmatch(dim)
            if blocks and blocks.group(1) in CHECKED_DIMS:
                return -(-sizes[blocks.group(1)] // int(blocks.group(2)))
            return None
        return tuple(size(d) for d in self.dims)


@dataclass(frozen=True, order=True)
class Variant:
    name: str
    tensors: tuple[VariantTensor, ...] = ()
    mask_mod: str = ""
    score_mod: str = ""
    score_mod_grad: str = ""
    # Whether a row's visible keys may have holes (a block-sparse layout): its kernels then test
    # each tile against the block mask's bitmaps and skip those without a visible score. Without,
    # they visit every block of a row's key range, which is cheaper for runs (documents).
    skip_blocks: bool = False
    # Which head dims build it (empty: every configured one); not part of a kernel's identity.
    head_dims: tuple[int, ...] = field(default=(), compare=False)
    # Whether its kernels are built with dropout too (a spec's own flag says which one it is).
    dropout: bool = field(default=False, compare=False)
    # Whether KV-cache kernels (flash_attn_with_kvcache) are built for it too.
    kvcache: bool = field(default=False, compare=False)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kernel kinds built for it."""
        return ("fwd", "bwd", "kvcache") if self.kvcache else ("fwd", "bwd")

    @property
    def struct(self) -> str:
        """The rendered struct's C++ name."""
        return f"flashgen::variants::{self.name}"

    @property
    def mask_kind(self) -> MaskKind | None:
        if not self.mask_mod:
            return None
        return MaskKind(self.name, f"flashgen::VariantMask<{self.struct}>", hides_keys=True)

    @property
    def score_mod_kind(self) -> ScoreModKind | None:
        if not self.score_mod:
            return None
        return ScoreModKind(self.name, f"flashgen::VariantScore<{self.struct}>", ("fwd", "bwd"))

    @property
    def per_head(self) -> bool:
        """Whether its mask_mod reads the query head: its block masks are then per head."""
        return bool(_READS_HEAD.search(self.mask_mod))

    @property
    def unit_gradient(self) -> bool:
        return bool(_UNIT.fullmatch(self.score_mod_grad))

    def cpp(self) -> str:
        """The variant's struct, in namespace flashgen::variants, for common/variant.cuh."""
        lines = [f"// The config's variant {self.name!r} (codegen/variants.py).",
                 "namespace flashgen::variants {", f"struct {self.name} {{"]
        lines += [f"  VariantTensor<const {t.cpp_type}, {len(t.dims)}> {t.name};"
                  for t in self.tensors]
        unit = "true" if self.unit_gradient else "false"
        lines.append(f"  static constexpr bool kUnitGradient = {unit};")
        skip = "true" if self.skip_blocks else "false"
        lines.append(f"  static constexpr bool kSkipBlocks = {skip};")
        per_head = "true" if self.per_head else "false"
        lines.append(f"  static constexpr bool kPerHead = {per_head};")
        inits = ", ".join(
            f"{t.name}(p.variant_tensor{i}, "
            + ", ".join(f"p.variant_size{i}_{d}" for d in range(MAX_RANK)) + ")"
            for i, t in enumerate(self.tensors))
        lines.append(f"  __device__ __forceinline__ explicit {self.name}(AttentionParams const& p)"
                     + (f"\n      : {inits} {{}}" if inits else " {}"))
        signature = "int b, int h, int q_idx, int kv_idx"
        if self.mask_mod:
            lines += _method("bool", "mask_mod", signature, self.mask_mod)
        if self.score_mod:
            lines += _method("float", "score_mod", f"float score, {signature}", self.score_mod)
            lines += _method("float", "score_mod_grad", f"float score, {signature}",
                             self.score_mod_grad)
        lines += ["};", "}  // namespace flashgen::variants", ""]
        return "\n".join(lines)


def check_source(variant: Variant) -> str:
    """A translation unit that compiles the variant's struct and calls each of its snippets: what
    `flashgen generate` compiles first, so that an invalid snippet fails in seconds with the
    compiler's message and the table's name (codegen/build.py's check_variants)."""
    calls = []
    if variant.mask_mod:
        calls.append("  visible[0] = v.mask_mod(0, 0, 1, 2);")
    if variant.score_mod:
        calls.append("  score[0] = v.score_mod(1.f, 0, 0, 1, 2) + "
                     "v.score_mod_grad(1.f, 0, 0, 1, 2);")
    return "\n".join([
        '#include "flashgen/common/variant_tensor.cuh"', "", variant.cpp(),
        "__global__ void flashgen_check_variant(flashgen::AttentionParams const p, bool* visible,",
        "                                       float* score) {",
        f"  const {variant.struct} v(p);", *calls, "}", ""])


def _method(result: str, name: str, parameters: str, snippet: str) -> list[str]:
    body = snippet.strip()
    if not re.search(r"\breturn\b", body):
        body = f"return ({body});"
    indented = "\n".join(f"    {line}" for line in body.splitlines())
    return [f"  __device__ __forceinline__ {result} {name}({parameters}) const {{",
            "    (void)b; (void)h; (void)q_idx; (void)kv_idx;", indented, "  }"]


def _dim_is_valid(dim: str) -> bool:
    blocks = _BLOCKS.fullmatch(dim)
    return (dim.isdigit() or bool(_NAME.fullmatch(dim))
            or bool(blocks and blocks.group(1) in CHECKED_DIMS))


def parse_variants(raw, fail) -> tuple[Variant, ...]:
    """The config's [variants.<name>] tables; fail(where, message) makes the ConfigError."""
    if not isinstance(raw, dict):
        raise fail("variants", "must be a table of [variants.<name>] tables")
    return tuple(_parse_variant(name, table, fail) for name, table in sorted(raw.items()))


def _parse_variant(name: str, table, fail) -> Variant:
    where = f"variants.{name}"
    if not isinstance(table, dict):
        raise fail(where, "must be a table")
    allowed = {"tensors", "mask_mod", "score_mod", "score_mod_grad", "skip_blocks", "head_dims",
               "dropout", "kvcache"}
    if "decode" in table:
        raise fail(f"{where}.decode", "is called kvcache = true now (flash_attn_with_kvcache's "
                                      "kernels, decode and chunked prefill)")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    if not _NAME.fullmatch(name) or name in MASKS or name in SCORE_MODS:
        raise fail(where, f"the name must be lower-case letters, digits and _, starting with a "
                   f"letter, and not a built-in mask or score modifier ({sorted(MASKS)}, "
                   f"{sorted(SCORE_MODS)})")
    snippets = {}
    for key in ("mask_mod", "score_mod", "score_mod_grad"):
        value = table.get(key, "")
        if not isinstance(value, str):
            raise fail(f"{where}.{key}", "must be a string of C++")
        snippets[key] = value.strip()
    if not snippets["mask_mod"] and not snippets["score_mod"]:
        raise fail(where, "give a mask_mod, a score_mod or both")
    if snippets["score_mod"] and not snippets["score_mod_grad"]:
        raise fail(f"{where}.score_mod_grad", "missing: the derivative of score_mod by score "
                   "(\"1\" for a bias)")
    if snippets["score_mod_grad"] and not snippets["score_mod"]:
        raise fail(f"{where}.score_mod_grad", "given without a score_mod")
    tensors_table = table.get("tensors", {})
    if not isinstance(tensors_table, dict) or len(tensors_table) > MAX_TENSORS:
        raise fail(f"{where}.tensors", f"must be a table of at most {MAX_TENSORS} entries "
                   f"name = \"dtype[dims]\"")
    tensors = []
    for tensor_name, declaration in tensors_table.items():
        tensor_where = f"{where}.tensors.{tensor_name}"
        match = _TENSOR.fullmatch(declaration) if isinstance(declaration, str) else None
        if not _NAME.fullmatch(tensor_name) or tensor_name in _RESERVED:
            raise fail(tensor_where, f"a tensor's name must be an identifier other than "
                       f"{sorted(_RESERVED)}")
        if match is None or match.group(1) not in DTYPES:
            raise fail(tensor_where, f"{declaration!r} must read \"dtype[dims]\" with dtype in "
                       f"{sorted(DTYPES)}, e.g. \"int32[batch, seqlen_k]\"")
        dims = tuple(re.sub(r"\s+", "", d) for d in match.group(2).split(","))
        if not 1 <= len(dims) <= MAX_RANK or not all(_dim_is_valid(d) for d in dims):
            raise fail(tensor_where, f"{declaration!r}: 1 to {MAX_RANK} dims, each a name, a "
                       f"number or one of {list(CHECKED_DIMS)} over a number (seqlen_q/128)")
        tensors.append(VariantTensor(tensor_name, match.group(1), dims))
    skip_blocks = table.get("skip_blocks", False)
    if not isinstance(skip_blocks, bool):
        raise fail(f"{where}.skip_blocks", "must be true or false")
    if skip_blocks and not snippets["mask_mod"]:
        raise fail(f"{where}.skip_blocks", "goes with a mask_mod (it skips the blocks it hides)")
    head_dims = table.get("head_dims", [])
    if not isinstance(head_dims, list) or not all(isinstance(d, int) for d in head_dims):
        raise fail(f"{where}.head_dims", "must be a list of head dims")
    dropout = table.get("dropout", False)
    if not isinstance(dropout, bool):
        raise fail(f"{where}.dropout", "must be true or false")
    kvcache = table.get("kvcache", False)
    if not isinstance(kvcache, bool):
        raise fail(f"{where}.kvcache", "must be true or false")
    return Variant(name, tuple(tensors), snippets["mask_mod"], snippets["score_mod"],
                   snippets["score_mod_grad"], skip_blocks, tuple(sorted(set(head_dims))),
                   dropout, kvcache)
