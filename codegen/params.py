"""The kernels' run-time arguments, written once: this table renders
templates/include/flashgen/common/params.h (the structs the kernels read, plus X-macro field lists
that the binding fills them by), and gives Python a builder per struct that takes the same fields
by name (`fwd_args`, `bwd_args`), so a new field is one row here and the code that sets it.

A row is a tensor (the C++ struct gets its data pointer and its batch, row and head strides in
elements; Python passes the torch tensor), an address (a pointer; Python passes an int) or a value.
Plain data on the C++ side: no torch, pybind11 or CUDA types, so the binding compiles with a host
compiler alone.
"""

from __future__ import annotations

import textwrap
from collections import namedtuple
from dataclasses import dataclass

STRIDES = ("batch", "row", "head")


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str              # C++ type; a tensor's is its pointer's
    comment: str = ""       # written above the field in params.h
    default: object = None  # Python's value when the caller leaves it out (None: required)
    tensor: bool = False    # a (batch, seq, heads, dim) tensor: pointer and STRIDES strides
    stride_prefix: str = ""  # the strides' name prefix if not the field's name
    optional: bool = False  # a tensor Python may pass as None: nullptr and zero strides

    def c_members(self) -> list[tuple[str, str]]:
        members = [(self.ctype, self.name)]
        if self.tensor:
            prefix = self.stride_prefix or self.name
            members += [("int64_t", f"{prefix}_{s}_stride") for s in STRIDES]
        return members


def _tensor(name: str, ctype: str, comment: str, stride_prefix: str = "",
            optional: bool = False) -> Field:
    return Field(name, ctype, comment, default=None, tensor=True, stride_prefix=stride_prefix,
                 optional=optional)


# A window bound that hides nothing: larger than any sequence, small enough that the kernels'
# sums of a row, an offset and a bound stay inside int (common/mask.cuh's WindowMask).
WINDOW_UNBOUNDED = 1 << 30

# A config-defined variant's tensor slots and their largest rank (codegen/variants.py).
VARIANT_TENSORS = 4
VARIANT_RANK = 4

# What every pass reads: the inputs and the problem's sizes, scale and mask.
ATTENTION_FIELDS = (
    _tensor("q", "const void*", "(batch, seqlen_q, heads, head_dim), any strides in elements "
            "(64-bit: batch * stride can pass 2^31), head dim contiguous"),
    _tensor("k", "const void*", "(batch, seqlen_k, heads_kv, head_dim)"),
    _tensor("v", "const void*", "(batch, seqlen_k, heads_kv, head_dim)"),
    Field("batch", "int"), Field("heads", "int"), Field("heads_kv", "int"),
    Field("seqlen_q", "int"), Field("seqlen_k", "int"),
    Field("softmax_scale", "float", "applied to q.k"),
    Field("scale_log2", "float", "softmax_scale * log2(e): the softmax runs on exp2"),
    Field("mask_offset", "int", "Causal mask: query row i sees key j iff j <= i + mask_offset. "
          "seqlen_k - seqlen_q aligns it to the bottom-right corner (FlashAttention), 0 to the "
          "top-left (PyTorch SDPA)", default=0),
    Field("window_left", "int", "The window mask kind's band: query row i sees key j iff "
          "i + mask_offset - window_left <= j <= i + mask_offset + window_right, each bound at "
          f"most {WINDOW_UNBOUNDED} (unbounded). The causal kind reads mask_offset alone",
          default=WINDOW_UNBOUNDED),
    Field("window_right", "int", "", default=0),
    Field("softcap", "float", "The softcap score modifier's cap c: scores become c * tanh(s * "
          "softmax_scale / c), and scale_log2 is c * log2(e) (codegen/score_mods.py)",
          default=0.0),
    Field("alibi_slopes", "const float*", "The alibi score modifier's slopes: query row i and key "
          "j add -slope * |i + offset - j| to the scaled score, offset the sequence's seqlen_k - "
          "seqlen_q; slope = alibi_slopes[batch * alibi_batch_stride + head]", default=0),
    Field("alibi_batch_stride", "int64_t", "0: one slope per head for every sequence",
          default=0),
    Field("attn_bias", "const float*", "The bias score modifier's (batch, heads, seqlen_q, "
          "seqlen_k) fp32 tensor added to the scaled scores (SDPA's attn_mask; -inf hides a key), "
          "keys contiguous, any other strides (0 broadcasts)", default=0),
    Field("attn_bias_batch_stride", "int64_t", default=0),
    Field("attn_bias_head_stride", "int64_t", default=0),
    Field("attn_bias_row_stride", "int64_t", default=0),
    Field("mask_ranges", "int*", "A config-defined mask's MaskRange and key-group bitmap "
          "(common/variant.cuh) per sequence and 16 query rows, (batch, ceil(seqlen_q / 16), "
          "mask_row_ints) ints", default=0),
    *(field_ for i in range(VARIANT_TENSORS) for field_ in (
        Field(f"variant_tensor{i}", "const void*", "A config-defined variant's tensors, "
              "contiguous, in the order its table declares them, each with its sizes (1 past "
              "its rank)" if i == 0 else "", default=0),
        *(Field(f"variant_size{i}_{d}", "int", "", default=1) for d in range(VARIANT_RANK)))),
    Field("dropout_p", "float", "The probability that dropout zeroes an attention probability "
          "(common/dropout.cuh); the kept ones are scaled by 1 / (1 - dropout_p)", default=0.0),
    Field("dropout_seed", "const int64_t*", "(1,) int64 on the device: the dropout mask's "
          "Philox key, drawn from torch's CUDA generator per forward call and reused by its "
          "backward", default=0),
    Field("cu_seqlens_q", "const int*", "(batch + 1,): a variable-length batch's sequence starts "
          "in packed (1, total rows, heads, head_dim) tensors, then the total; seqlen_q and "
          "seqlen_k are then the longest lengths, each sequence's causal mask aligns bottom-right "
          "and per-row statistics are (heads, total rows). nullptr: equal lengths", default=0),
    Field("cu_seqlens_k", "const int*", "(batch + 1,): the keys' starts, with cu_seqlens_q; "
          "nullptr with cu_seqlens_q: the keys are a KV cache (KV_CACHE_FIELDS)", default=0),
    Field("seqused_k", "const int*", "(batch,), with cu_seqlens_q: the keys each sequence "
          "attends to, the first seqused_k[b] of its run in cu_seqlens_k (FlashAttention-3's); "
          "nullptr: the whole run", default=0),
    Field("sinks", "const float*", "(heads,) fp32: each query head's learnable sink logit, in "
          "the scaled scores' units, which joins every row's softmax denominator with no value "
          "(gpt-oss's s_aux); the forward passes fold it into o and softmax_lse. nullptr: none",
          default=0),
)

# Where a sequence's keys are when k and v are a KV cache: read by the decode kind, and by the
# hopper family's forward for chunked prefill (the mma family's forward refuses them).
KV_CACHE_FIELDS = (
    Field("cache_seqlens", "const int*", "(batch,): the keys in each sequence's cache before this "
          "call's new ones; nullptr: seqlen_k, the whole cache", default=0),
    Field("cache_batch_idx", "const int*", "(batch,): the cache row of each sequence; nullptr: "
          "its own index", default=0),
    Field("cache_leftpad", "const int*", "(batch,), a contiguous cache: each sequence's first "
          "key's position (FlashAttention-2's cache_leftpad): attention covers positions "
          "cache_leftpad .. cache_seqlens + seqlen_new - 1, key indices (masks, ALiBi) count from "
          "it, appended keys and rotary positions do not. nullptr: 0", default=0),
    Field("block_table", "const int*", "(batch, pages per sequence): a paged cache's page of "
          "each run of page_size keys; k and v are then (pages, page_size, heads_kv, head_dim). "
          "nullptr: a contiguous cache", default=0),
    Field("block_table_batch_stride", "int64_t", default=0),
    Field("page_size", "int", default=0),
    Field("seqlen_new", "int", "keys appended this call (k_new, by the decode kind's append): a "
          "sequence attends to cache_seqlens + seqlen_new keys", default=0),
)

FWD_FIELDS = (
    _tensor("o", "void*", "(batch, seqlen_q, heads, head_dim)"),
    Field("softmax_lse", "float*", "(batch, heads, seqlen_q), contiguous, natural log"),
    Field("ranks_per_round", "int", "mma family: the grid's order (block_order.cuh, "
          "flashgen/schedule.py)", default=1),
    Field("tile_counter", "int*", "hopper family: an int that the launcher zeroes and a "
          "persistent grid's blocks claim their next tiles from, in order, as they free up "
          "(fwd_kernel.cuh). nullptr: tiles dealt out statically", default=0),
    Field("q_view_batch", "int", "hopper family: q and o's (batch, rows) extents as laid out, "
          "the bounds of their TMA descriptors: (batch, seqlen_q), or (1, total rows) for a "
          "variable-length batch. 0: batch and seqlen_q", default=0),
    Field("q_view_rows", "int", default=0),
    Field("kv_view_batch", "int", "hopper family: k and v's (batch, rows) extents as laid out: "
          "(batch, seqlen_k), (1, total rows) packed, (cache rows, capacity) for a contiguous "
          "cache, (pages, page_size) for a paged one. 0: batch and seqlen_k", default=0),
    Field("kv_view_rows", "int", default=0),
    *(field_ for name in ("q", "k", "v") for field_ in (
        Field(f"{name}_descale", "const float*", "The e4m3 forward (the hopper family's fwd_fp8 "
              "kind): q's, k's and v's dequantisation factors, fp32 per (batch, KV head), "
              "element b * <name>_descale_batch_stride + h * <name>_descale_head_stride "
              "(FlashAttention-3's q_descale, k_descale, v_descale); the scores are scaled by "
              "q's and k's, the output by v's. v is then V^T with its keys permuted "
              "(flashgen/fp8.py): (batch, heads_kv, head_dim, keys), v_row_stride the head "
              "dim's. nullptr: 1" if name == "q" else "", default=0),
        Field(f"{name}_descale_batch_stride", "int64_t", "", default=0),
        Field(f"{name}_descale_head_stride", "int64_t", "", default=0))),
) + KV_CACHE_FIELDS

BWD_FIELDS = (
    _tensor("o", "const void*", "(batch, seqlen_q, heads, head_dim): the forward's output"),
    _tensor("dout", "const void*", "(batch, seqlen_q, heads, head_dim)", stride_prefix="do"),
    _tensor("dq", "void*", "(batch, seqlen_q, heads, head_dim)"),
    _tensor("dk", "void*", "(batch, seqlen_k, heads_kv, head_dim): summed over each KV head's "
            "group"),
    _tensor("dv", "void*", "(batch, seqlen_k, heads_kv, head_dim)"),
    Field("softmax_lse", "const float*", "(batch, heads, seqlen_q), contiguous, natural log"),
    Field("softmax_d", "float*", "(batch, heads, seqlen_q) workspace: rowsum(dout * out); "
          "hopper family: rows padded to whole query blocks"),
    Field("dq_accum", "float*", "(batch, heads, seqlen_q, head_dim padded to the kernel's row "
          "chunk) fp32 workspace that the key blocks add their dq contributions to; nullptr "
          "selects the deterministic path (a second kernel computes dq per query block). hopper "
          "family: per (batch, head, query block) in the kernel's register order "
          "(hopper/bwd_aux.cuh), never nullptr"),
    Field("softmax_lse_log2", "float*", "hopper family: (batch, heads, seqlen_q padded to whole "
          "query blocks) workspace: softmax_lse * log2(e), +inf past the sequence and where a row "
          "saw no key", default=0),
    Field("dq_semaphore", "int*", "hopper family: per (batch, head, query block, consumer "
          "warpgroup) int workspace that the launcher zeroes: the key blocks then add dQ in a "
          "fixed order (deterministic). nullptr: in any order", default=0),
    Field("dq_state", "int*", "hopper family, not deterministic: per (batch, head, query block) "
          "int workspace that the prepare kernel zeroes: 0 while no key block has reached the "
          "query block, 1 while the first to reach it stores its dQ shares to the workspace "
          "(which then needs no zeroing), 2 once they are stored and the others may add. "
          "Kernels whose consumers add dQ from registers (BwdTraits::kDqFromRegisters) ignore it",
          default=0),
    Field("dkv_accum", "float*", "mma family: (split_blocks, 2, block_n, head_dim padded) fp32 "
          "workspace, zeroed by the launcher, where the pieces of each split key block add their "
          "dK and dV, then split_blocks int counters of the pieces that have added (the last one "
          "writes dK and dV). Unused when split_blocks is 0", default=0),
    Field("sorted_tail_blocks", "int", "the backward grid's order (block_work_sorted_tail, "
          "flashgen/schedule.py); the hopper family's deterministic runs keep their own",
          default=0),
    Field("deterministic_rotation", "int", "hopper family, deterministic, without a mask: 1 "
          "where a (batch, KV head)'s key blocks fill at most a quarter of the SMs (all run at "
          "once), so that each starts its walk its own share of the way in, as without "
          "determinism, and a query block's dQ turns follow the order the key blocks reach it; "
          "0: the key "
          "blocks walk in order and the turns descend (each waits only on blocks launched "
          "before it)", default=0),
    Field("split_blocks", "int", "mma family: the dK/dV grid's last split_blocks key blocks run "
          "as `splits` pieces each, each a share of the block's steps (grid_piece). Not on the "
          "deterministic path", default=0),
    Field("splits", "int", default=1),
    Field("attn_bias_grad", "float*", "mma family, bias score modifier: (batch, heads, seqlen_q, "
          "seqlen_k) fp32, contiguous, of equal lengths, where the dK/dV kernel writes dS, the "
          "gradient of the bias it added (nullptr: none wanted)", default=0),
    Field("q_view_rows", "int", "the rows of q, dout and dq as laid out: the total rows of a "
          "variable-length batch (packed, batch 1), which bound the hopper family's TMA "
          "descriptors and size its packed workspaces and the mma family's. 0: seqlen_q (equal "
          "lengths)", default=0),
    Field("kv_view_rows", "int", "the rows of k, v, dk and dv as laid out, with q_view_rows. 0: "
          "seqlen_k", default=0),
)

# Attention over a KV cache (the mma family's decode kind): q holds the new tokens' queries, k and
# v the cache, seqlen_k its capacity per sequence. One launch may append the new keys and values
# (rotated) first, and split the keys over several blocks, the last of which to finish combines
# their partial results.
DECODE_FIELDS = (
    _tensor("o", "void*", "(batch, seqlen_q, heads, head_dim)"),
    Field("softmax_lse", "float*", "(batch, heads, seqlen_q), contiguous, natural log"),
    Field("num_splits", "int", "blocks that share each (sequence, KV head)'s keys, each an equal "
          "share of its key blocks; above 1 they write o_accum and lse_accum and the last "
          "of them to finish combines them into o and softmax_lse; 0: append only (the "
          "hopper forward attends, for chunked prefill)", default=1),
    Field("o_accum", "float*", "(num_splits, batch, heads, seqlen_q, head_dim) fp32 workspace: "
          "each split's normalised output", default=0),
    Field("lse_accum", "float*", "(num_splits, batch, heads, seqlen_q) fp32 workspace: each "
          "split's lse (-inf where it saw no key)", default=0),
    Field("split_counters", "int*", "with num_splits > 1: one counter per (query block, "
          "sequence and KV head) of the grid, 0 before the launch and after it (the block "
          "that finds itself the last of its splits combines them and resets its counter)",
          default=0),
    Field("split_counter_count", "int", "split_counters' length; a launch that needs more "
          "fails", default=0),
    Field("min_seqlen_q", "int", "a variable-length batch: this launch attends for the "
          "sequences of min_seqlen_q to seqlen_q queries and leaves the others' rows alone (a "
          "batch mixing prefill and decode runs as two launches, each on its own tile and "
          "split); 0: every sequence", default=0),
    Field("q_view_rows", "int", "a variable-length batch: q's rows as packed (the total, and any "
          "spare rows after it), which size the grids over its packed query blocks and rows in "
          "place of a dense batch of the longest (packed_blocks.cuh's DecodeBlocks); 0 "
          "otherwise", default=0),
) + KV_CACHE_FIELDS + (
    _tensor("k_new", "const void*", "(batch, seqlen_new, heads_kv, head_dim): keys to append at "
            "cache_seqlens (rotated when rotary_dim > 0) before attending; nullptr: none",
            optional=True),
    _tensor("v_new", "const void*", "(batch, seqlen_new, heads_kv, head_dim)", optional=True),
    _tensor("q_rot", "void*", "(batch, seqlen_q, heads, head_dim): q rotated, written by the "
            "append kernel and read by attention in place of q when rotary_dim > 0",
            optional=True),
    Field("rotary_cos", "const void*", "(rotary rows, rotary_dim / 2), contiguous, q's dtype",
          default=0),
    Field("rotary_sin", "const void*", default=0),
    Field("rotary_dim", "int", "columns rotated (even, at most head_dim); 0: no rotary embedding",
          default=0),
    Field("rotary_interleaved", "int", "1: pairs (2i, 2i + 1) (GPT-J); 0: pairs (i, i + "
          "rotary_dim / 2) (GPT-NeoX)", default=1),
)

# Each pass's struct derives from AttentionParams: its members come after the base's, in memory
# and in the order Python passes them.
BASE = "AttentionParams"
STRUCTS = {BASE: ATTENTION_FIELDS, "FwdParams": FWD_FIELDS, "BwdParams": BWD_FIELDS,
           "DecodeParams": DECODE_FIELDS}


def members(fields_: tuple[Field, ...]) -> list[tuple[str, str]]:
    """The C++ struct's (type, name) members in order, its base's first (for FWD_FIELDS and
    BWD_FIELDS): what the binding takes, positionally."""
    own = [m for f in fields_ for m in f.c_members()]
    return own if fields_ is ATTENTION_FIELDS else members(ATTENTION_FIELDS) + own


def _args_builder(name: str, fields_: tuple[Field, ...]):
    """A namedtuple of the struct's members in order, and a function that builds one from the
    table's fields by keyword (keyword-only, so a default may sit anywhere; a tensor field gives
    its data pointer and strides). Callers pass the tuple with *args: the binding is positional,
    faster per call than keywords."""
    fields_ = ATTENTION_FIELDS + fields_
    tuple_type = namedtuple(name, [m for f in fields_ for _, m in f.c_members()])
    params = ", ".join(f.name if f.default is None and not f.optional
                       else f"{f.name}={f.default!r}" for f in fields_)
    body, values = [], []
    for f in fields_:
        if f.tensor and f.optional:
            body.append(f"    {f.name}_strides = (0, 0, 0) if {f.name} is None else "
                        f"{f.name}.stride()")
            values += [f"0 if {f.name} is None else {f.name}.data_ptr()"]
            values += [f"{f.name}_strides[{i}]" for i in range(3)]
        elif f.tensor:
            body.append(f"    {f.name}_strides = {f.name}.stride()")
            values += [f"{f.name}.data_ptr()"] + [f"{f.name}_strides[{i}]" for i in range(3)]
        else:
            values.append(f.name)
    source = "\n".join([f"def build(*, {params}):", *body,
                        f"    return _new(_type, ({', '.join(values)},))"]) + "\n"
    scope = {"_new": tuple.__new__, "_type": tuple_type}
    exec(source, scope)  # noqa: S102 - the text is made from the table above, nothing else
    build = scope["build"]
    build.__name__ = build.__qualname__ = name.lower().replace("args", "_args")
    return tuple_type, build


# What a pass that reads only the shared fields takes (a variant's mask ranges).
AttentionArgs, attention_args = _args_builder("AttentionArgs", ())
FwdArgs, fwd_args = _args_builder("FwdArgs", FWD_FIELDS)
BwdArgs, bwd_args = _args_builder("BwdArgs", BWD_FIELDS)
DecodeArgs, decode_args = _args_builder("DecodeArgs", DECODE_FIELDS)


def _comment(text: str, indent: str, width: int = 100) -> list[str]:
    return [f"{indent}// {line}" for line in textwrap.wrap(text, width=width - len(indent) - 3)]


def header_text() -> str:
    """params.h, deterministic."""
    lines = [
        "// Generated from codegen/params.py, the one table of the kernels' run-time arguments: "
        "edit the",
        "// table, then `python -m codegen.params` rewrites this file.",
        "// Plain data: the Python binding fills it, the kernel reads it. No torch, pybind11 or "
        "CUDA types,",
        "// so the binding compiles with a host compiler alone.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace flashgen {",
    ]
    for struct, fields_ in STRUCTS.items():
        base = "" if struct == BASE else f" : {BASE}"
        lines += ["", f"struct {struct}{base} {{"]
        for f in fields_:
            lines += _comment(f.comment, "  ")
            lines += [f"  {ctype} {name};" for ctype, name in f.c_members()]
        lines.append("};")
    lines += ["", "}  // namespace flashgen", "",
              "// Every member in order, the base's first, for the binding: X(name) once per "
              "member."]
    for struct, fields_ in STRUCTS.items():
        names = [f"X({name})" for f in fields_ for _, name in f.c_members()]
        if struct != BASE:
            names.insert(0, f"FLASHGEN_{BASE.upper()}_MEMBERS(X)")
        macro = f"#define FLASHGEN_{struct.upper()}_MEMBERS(X)"
        lines += [f"{line} \\" for line in textwrap.wrap(" ".join([macro, *names]), width=97,
                                                           subsequent_indent="  ")]
        lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines) + "\n"


HEADER = "flashgen/common/params.h"  # under codegen.paths.INCLUDE_DIR


if __name__ == "__main__":
    from codegen.paths import INCLUDE_DIR

    (INCLUDE_DIR / HEADER).write_text(header_text())
    print(f"wrote {INCLUDE_DIR / HEADER}")
