"""The torch ops' per-call arguments, written once: this table gives flashgen/ops.py each op's
schema, the tuple attention() passes to flashgen::fwd, each kernel function's parameters (checked
at import), by-name views for the fake implementations, and what fwd's autograd saves for bwd. A
new per-call argument is one row here and the code that reads it, as codegen/params.py is for the
kernels' params.

A row belongs to the ops in its `ops`; each op takes its rows in the table's order. Derived, not
declared: bwd reuses every argument of fwd that it takes too (fwd's autograd saves it, a tensor
with save_for_backward, anything else on ctx), and bwd's own rows come from the backward's
gradient (dout), fwd's outputs (out, lse) or the backward itself (attn_bias_grad).
"""

from __future__ import annotations

import inspect
import operator
from collections import namedtuple
from dataclasses import dataclass

from codegen import params

FWD, BWD, FWD_KVCACHE, MASK_RANGES = "fwd", "bwd", "fwd_kvcache", "mask_ranges"
_ATTENTION = (FWD, BWD)
_EVERY_OP = (FWD, BWD, FWD_KVCACHE, MASK_RANGES)
REQUIRED = object()  # a row's default when callers must pass it


@dataclass(frozen=True)
class Argument:
    name: str
    type: str                 # its schema type, e.g. "Tensor?", "SymInt", "Tensor(a!)"
    ops: tuple[str, ...]      # the ops that take it
    doc: str = ""
    default: object = REQUIRED  # where given, every op's trailing default for it
    source: str = ""          # attention()'s expression for it (empty: its parameter of this name)
    gradient: str = ""        # the bwd output that is its gradient
    slot: int | None = None   # its index among a variant's tensors (variant_tensor<slot>)

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")

    def schema(self) -> str:
        text = f"{self.type} {self.name}"
        return text if self.default is REQUIRED else f"{text}={_schema_value(self.default)}"


def _schema_value(value) -> str:
    if value is None:
        return "None"
    return f'"{value}"' if isinstance(value, str) else str(value)


def _slot(i: int, tensors: str = "mods.variant_tensors") -> str:
    """The expression for variant_tensor{i}: the variant's i-th tensor, else None."""
    return f"{tensors}[{i}] if len({tensors}) > {i} else None"


ARGUMENTS = (
    Argument("dout", "Tensor", (BWD,), "the gradient of fwd's out, any strides"),
    Argument("q", "Tensor", _EVERY_OP, "(batch, seqlen_q, heads, head_dim) fp16/bf16, validated",
             gradient="dq"),
    Argument("k", "Tensor", (FWD, BWD, MASK_RANGES), "(batch, seqlen_k, heads_kv, head_dim)",
             gradient="dk"),
    Argument("v", "Tensor", _ATTENTION, "(batch, seqlen_k, heads_kv, head_dim)", gradient="dv"),
    Argument("out", "Tensor", (BWD,), "fwd's out"),
    Argument("lse", "Tensor", (BWD,), "fwd's lse"),
    Argument("attn_bias_grad", "bool", (BWD,), "also return the gradient of attn_bias, dbias "
             "(batch, heads, seqlen_q, seqlen_k) fp32 (else an empty tensor)"),
    Argument("k_cache", "Tensor(a!)", (FWD_KVCACHE,), "the keys' cache, appended to in place"),
    Argument("v_cache", "Tensor(b!)", (FWD_KVCACHE,), "the values' cache, appended to in place"),
    Argument("k_new", "Tensor?", (FWD_KVCACHE,), "keys to append at cache_seqlens (rotated "
             "with rotary_cos and rotary_sin) before attending"),
    Argument("v_new", "Tensor?", (FWD_KVCACHE,), "values to append with k_new"),
    Argument("rotary_cos", "Tensor?", (FWD_KVCACHE,)),
    Argument("rotary_sin", "Tensor?", (FWD_KVCACHE,)),
    Argument("cache_seqlens", "Tensor?", (FWD_KVCACHE,)),
    Argument("cache_batch_idx", "Tensor?", (FWD_KVCACHE,)),
    Argument("cache_leftpad", "Tensor?", (FWD_KVCACHE,), "each sequence's first key's position "
             "in a contiguous cache"),
    Argument("block_table", "Tensor?", (FWD_KVCACHE,)),
    Argument("scale", "float", (FWD, BWD, FWD_KVCACHE), "applied to q.k"),
    Argument("mask", "str", _ATTENTION, "a mask kind (codegen/masks.py)"),
    # The mask's per-call band (flashgen/band.py's Band, params.h); fwd_kvcache's aligns
    # bottom-right per sequence (flashgen/decode.py).
    Argument("mask_offset", "SymInt", _ATTENTION, source="band.offset"),
    Argument("window_left", "int", (FWD, BWD, FWD_KVCACHE), source="band.left"),
    Argument("window_right", "int", (FWD, BWD, FWD_KVCACHE), source="band.right"),
    # The score modifiers (flashgen/modifiers.py's Modifiers): softcap > 0 caps the scores,
    # alibi_slopes (fp32 (heads,) or (batch, heads)) and attn_bias (SDPA's attn_mask, additive
    # fp32) bias them.
    Argument("softcap", "float", (FWD, BWD, FWD_KVCACHE), source="mods.softcap"),
    Argument("alibi_slopes", "Tensor?", (FWD, BWD, FWD_KVCACHE), source="mods.alibi_slopes"),
    Argument("attn_bias", "Tensor?", _ATTENTION, source="mods.attn_bias", gradient="dbias"),
    # Attention sinks: (heads,) fp32 logits that join each row's softmax denominator
    # (common/sinks.cuh); bwd returns their gradient.
    Argument("sinks", "Tensor?", (FWD, BWD, FWD_KVCACHE), source="mods.sinks",
             gradient="dsinks"),
    Argument("rotary_interleaved", "bool", (FWD_KVCACHE,)),
    Argument("num_splits", "int", (FWD_KVCACHE,), "0: flashgen/decode.py chooses"),
    # A config-defined variant (flashgen/variants.py) by name, or "", with its tensors as separate
    # optional arguments (params.h's slots): a Tensor[] argument would make autograd match
    # gradients to the arguments as the caller passed them, defaults left out.
    Argument("variant", "str", _EVERY_OP,
             source='"" if mods.variant is None else mods.variant.name'),
    *(Argument(f"variant_tensor{i}", "Tensor?", _EVERY_OP, source=_slot(i), slot=i)
      for i in range(params.VARIANT_TENSORS)),
    Argument("mask_ranges", "Tensor?", _ATTENTION, "the variant's mask's block ranges "
             "(flashgen::mask_ranges)", source="mods.mask_ranges"),
    # dropout_p > 0 drops probabilities under the Philox key in dropout_seed ((1,) int64, drawn
    # once per forward: the backward regenerates the same mask from it, common/dropout.cuh).
    Argument("dropout_p", "float", _ATTENTION, source="mods.dropout_p"),
    Argument("dropout_seed", "Tensor?", _ATTENTION, source="mods.dropout_seed"),
    Argument("deterministic", "bool", _ATTENTION, "the backward bit-reproducible"),
    Argument("heads_first", "bool", _ATTENTION, "outputs laid out (batch, heads, seq, dim)"),
    # A variable-length batch packed into (1, total rows, heads, dim) views
    # (flash_attn_varlen_func) and its longest lengths; over a KV cache (fwd_kvcache) only the
    # queries are, the cache's lengths being cache_seqlens. seqused_k: the keys each sequence
    # uses of its run (forward only).
    Argument("cu_seqlens_q", "Tensor?", (FWD, BWD, FWD_KVCACHE, MASK_RANGES), default=None,
             source="varlen[0]"),
    Argument("cu_seqlens_k", "Tensor?", (FWD, BWD, MASK_RANGES), default=None,
             source="varlen[1]"),
    Argument("seqused_k", "Tensor?", (FWD,), default=None,
             source="varlen[4] if len(varlen) > 4 else None"),
    Argument("max_seqlen_q", "SymInt", (FWD, BWD, FWD_KVCACHE, MASK_RANGES), default=0,
             source="varlen[2]"),
    Argument("max_seqlen_k", "SymInt", (FWD, BWD, MASK_RANGES), default=0, source="varlen[3]"),
)

# Each op's outputs, by name.
RETURNS = {FWD: "(Tensor out, Tensor lse)",
           BWD: "(Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor dsinks)",
           FWD_KVCACHE: "(Tensor out, Tensor lse)",
           MASK_RANGES: "Tensor"}


class Op:
    """One op's rows, in the table's order, and what is derived from them at import."""

    def __init__(self, name: str):
        self.name = name
        self.rows = tuple(a for a in ARGUMENTS if name in a.ops)
        self.names = tuple(a.name for a in self.rows)
        self.position = {n: i for i, n in enumerate(self.names)}
        defaulted = [a.default is not REQUIRED for a in self.rows]
        if defaulted != sorted(defaulted):
            raise AssertionError(f"flashgen: {name}'s arguments with defaults must come last")
        # What the dispatcher leaves out of a call when it equals its default, in order.
        self.defaults = tuple(a.default for a in self.rows if a.default is not REQUIRED)
        self.schema = (f"{name}({', '.join(a.schema() for a in self.rows)}) -> "
                       f"{RETURNS[name]}")
        # Each output's name ("" where unnamed).
        self.outputs = tuple((part.split() + [""])[1]
                             for part in RETURNS[name].strip("()").split(","))
        self.Arguments = namedtuple(f"{name}_arguments", self.names, defaults=self.defaults)

    def view(self, arguments: tuple):
        """The op's arguments as the dispatcher passed them (trailing defaults perhaps left
        out), by name. 0.3 us: for the fake implementations, not the kernels' path."""
        return self.Arguments(*arguments)

    def implements(self, function):
        """function, after checking that its parameters are this op's arguments by name, in
        order, with their defaults: the kernel functions take them directly (a view would cost
        0.3 us per call)."""
        found = [(p.name, REQUIRED if p.default is p.empty else p.default)
                 for p in inspect.signature(function).parameters.values()]
        wanted = [(a.name, a.default) for a in self.rows]
        if found != wanted:
            raise AssertionError(f"flashgen: {function.__qualname__} takes {found}, flashgen::"
                                 f"{self.name}'s arguments are {wanted} (flashgen/op_schema.py)")
        return function


OPS = {name: Op(name) for name in _EVERY_OP}


def _function(source: str):
    scope = {}
    exec(source, scope)  # noqa: S102 - the text is made from the table above, nothing else
    return next(value for name, value in scope.items() if name != "__builtins__")


def _attention_call():
    """attention()'s tuple of fwd's arguments from its own (q, k, v, scale, mask, band,
    deterministic, heads_first, mods, varlen), one tuple built per call: each row's source, and
    the defaulted rows only for a variable-length batch (a dense call leaves them out, as the
    dispatcher would)."""
    op = OPS[FWD]
    required = [a.source or a.name for a in op.rows if a.default is REQUIRED]
    tail = [a.source or repr(a.default) for a in op.rows if a.default is not REQUIRED]
    return _function("\n".join([
        "def fwd_arguments(q, k, v, scale, mask, band, deterministic, heads_first, mods, varlen):",
        f"    arguments = ({', '.join(f'({e})' for e in required)},)",
        "    if varlen:",
        f"        arguments += ({', '.join(f'({e})' for e in tail)},)",
        "    return arguments"]) + "\n")


def _keyword_call(name: str):
    """A function that takes an op's arguments by keyword (a variant's tensors as one tuple,
    variant_tensors; the defaulted ones optional) and returns them in the op's order: no dict is
    built per call."""
    op = OPS[name]
    parameters = [a.name if a.default is REQUIRED else f"{a.name}={a.default!r}"
                  for a in op.rows if a.slot is None]
    parameters.insert(next(i for i, a in enumerate(op.rows) if a.slot is not None),
                      "variant_tensors")
    values = [a.name if a.slot is None else _slot(a.slot, "variant_tensors") for a in op.rows]
    return _function(f"def {name}_arguments(*, {', '.join(parameters)}):\n"
                     f"    return ({', '.join(f'({e})' for e in values)},)\n")


fwd_arguments = _attention_call()
fwd_kvcache_arguments = _keyword_call(FWD_KVCACHE)
mask_ranges_arguments = _keyword_call(MASK_RANGES)


class Saved:
    """What fwd's autograd keeps for bwd, by name: fwd's arguments that bwd takes too (tensors
    with save_for_backward, the rest on ctx) and fwd's outputs; `bwd_order` picks bwd's
    arguments in its order out of them, the backward's gradient and attn_bias_grad."""

    def __init__(self):
        fwd, bwd = OPS[FWD], OPS[BWD]
        shared = [a for a in fwd.rows if BWD in a.ops]
        tensors = [a.name for a in shared if a.is_tensor]
        values = [a.name for a in shared if not a.is_tensor]
        # itemgetters over fwd's full argument tuple: C calls, no per-call loop.
        self.tensors = operator.itemgetter(*(fwd.position[n] for n in tensors))
        self.values = operator.itemgetter(*(fwd.position[n] for n in values))
        # The backward's pool: (dout, attn_bias_grad, *saved tensors, *fwd's outputs, *values).
        pool = ["dout", "attn_bias_grad", *tensors, *fwd.outputs, *values]
        missing = [n for n in bwd.names if n not in pool]
        if missing:
            raise AssertionError(f"flashgen: bwd's arguments {missing} are neither fwd's nor its "
                                 f"outputs nor the backward's own")
        self.bwd_order = operator.itemgetter(*(pool.index(n) for n in bwd.names))
        # (fwd's position, bwd's output) of each argument with a gradient.
        self.gradients = tuple((fwd.position[a.name], bwd.outputs.index(a.gradient))
                               for a in fwd.rows if a.gradient)
        # The compiled replay's backward takes (dout, *saved tensors, *fwd's outputs, *values):
        # where q, k, v, out, dout and lse are in it, the order of backward.py's kept inputs.
        replayed = ["dout", *tensors, *fwd.outputs, *values]
        self.replayed = tuple(replayed.index(n) for n in ("q", "k", "v", "out", "dout", "lse"))


SAVED = Saved()
