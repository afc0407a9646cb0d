"""flashgen/op_schema.py's table is what torch registered, and every row reaches the kernel's
params: each op called through the dispatcher with a distinct value for every argument, on the
real Python path down to a binding that records (tests/kernel_mock.py), each value found where
the params take it or in the Python pass that consumes it. A row without an entry here fails
test_every_row_is_checked."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from codegen import params  # noqa: E402
from flashgen import ops  # noqa: E402
from flashgen.op_schema import (ARGUMENTS, BWD, FWD, FWD_KVCACHE, MASK_RANGES, OPS,  # noqa: E402
                                REQUIRED, fwd_arguments)
from tests import kernel_mock  # noqa: E402

LOG2_E = math.log2(math.e)
OP = {name: getattr(torch.ops.flashgen, name).default for name in OPS}
# The binding entry of each op's launch and the params tuple it takes.
LAUNCHES = {FWD: ("fwd", params.FwdArgs), BWD: ("bwd", params.BwdArgs),
            FWD_KVCACHE: ("decode", params.DecodeArgs),
            MASK_RANGES: ("attention", params.AttentionArgs)}
HEADS, HEADS_KV, HEAD_DIM = 4, 2, 64


@pytest.mark.parametrize("name", OPS)
def test_registered_schemas_are_the_tables(name):
    schema = OP[name]._schema
    assert str(schema) == f"flashgen::{OPS[name].schema}"
    rows = OPS[name].rows
    assert [a.name for a in schema.arguments] == [row.name for row in rows]
    for argument, row in zip(schema.arguments, rows):
        assert argument.has_default_value() == (row.default is not REQUIRED), row.name
    assert [r.name for r in schema.returns] == list(OPS[name].outputs)


def test_the_backward_reuses_what_fwd_and_bwd_share_and_returns_gradients_by_name():
    fwd, bwd = OPS[FWD], OPS[BWD]
    shared = [n for n in fwd.names if n in bwd.names]
    assert [n for n in bwd.names if n not in shared] == ["dout", "out", "lse", "attn_bias_grad"]
    assert {a.name: a.gradient for a in ARGUMENTS if a.gradient} == {
        "q": "dq", "k": "dk", "v": "dv", "attn_bias": "dbias", "sinks": "dsinks"}


@pytest.fixture
def mocked(monkeypatch):
    """kernel_mock, with the ops' own kernel functions for CPU tensors too (the dispatcher sends
    the mock's tensors to the CPU key)."""
    record = kernel_mock.install(monkeypatch)
    with torch.library._scoped_library("flashgen", "IMPL") as library:
        library.impl("fwd", ops._fwd_cuda, "CPU")
        library.impl("bwd", ops._bwd_cuda, "CPU")
        library.impl("fwd_kvcache", ops._fwd_kvcache_cuda, "CPU")
        library.impl("mask_ranges", ops._mask_ranges_cuda, "CPU")
        yield record


def launched(record, op: str):
    """The params tuple of the op's one launch, by name."""
    entry, args_type = LAUNCHES[op]
    (args,) = [args for e, args in record.launches if e == entry]
    return args_type._make(args[2:])  # after the launcher's address and error string's


def pointer_and_strides(args, name: str, t, prefix: str = "") -> bool:
    prefix = prefix or name
    return (getattr(args, name), *(getattr(args, f"{prefix}_{s}_stride") for s in params.STRIDES)
            ) == (t.data_ptr(), *t.stride()[:3])


def variant_tensors():
    """Four tensors of distinct ranks and sizes for the four slots."""
    return [torch.randn(*shape) for shape in ((5, 9), (3,), (2, 3, 6), (1, 2, 7, 4))]


def slot_holds(args, i: int, t) -> bool:
    """Whether variant tensor slot i has t's address and sizes."""
    return (getattr(args, f"variant_tensor{i}") == t.data_ptr()
            and all(getattr(args, f"variant_size{i}_{d}") == n for d, n in enumerate(t.shape)))


# --- fwd and bwd, through autograd ---------------------------------------------------------

# A variable-length batch of two sequences: (3, 6) and (5, 7) rows.
CU_SEQLENS_Q, CU_SEQLENS_K, MAX_SEQLEN_Q, MAX_SEQLEN_K = [0, 3, 8], [0, 6, 13], 5, 7


def fwd_values():
    """A distinct value for every fwd argument (none equal to another or to its default)."""
    tensors = variant_tensors()
    return dict(
        q=torch.randn(1, 8, HEADS, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True),
        k=torch.randn(1, 13, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True),
        v=torch.randn(1, 13, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True),
        scale=0.3, mask="causal", mask_offset=17, window_left=13, window_right=9, softcap=5.5,
        alibi_slopes=torch.randn(2, 6)[:, :HEADS],
        # shaped as the backward's dbias (of the packed views: the public functions refuse a
        # bias with a variable-length batch, the op does not)
        attn_bias=torch.randn(1, HEADS, 8, 13, requires_grad=True),
        sinks=torch.randn(HEADS, requires_grad=True), variant="relative_bias",
        **{f"variant_tensor{i}": t for i, t in enumerate(tensors)},
        mask_ranges=torch.zeros(2, 1, 5, dtype=torch.int32), dropout_p=0.25,
        dropout_seed=torch.tensor([123]), deterministic=True, heads_first=True,
        cu_seqlens_q=torch.tensor(CU_SEQLENS_Q, dtype=torch.int32),
        cu_seqlens_k=torch.tensor(CU_SEQLENS_K, dtype=torch.int32),
        seqused_k=None, max_seqlen_q=MAX_SEQLEN_Q, max_seqlen_k=MAX_SEQLEN_K)


def shared_fields_hold(args, a: dict) -> dict:
    """Whether each argument that fwd and bwd share reached their params, by name."""
    tensors = [a[f"variant_tensor{i}"] for i in range(params.VARIANT_TENSORS)]
    return {
        "q": pointer_and_strides(args, "q", a["q"]),
        "k": pointer_and_strides(args, "k", a["k"]),
        "v": pointer_and_strides(args, "v", a["v"]),
        "scale": args.softmax_scale == pytest.approx(a["scale"]),
        "mask_offset": args.mask_offset == a["mask_offset"],
        "window_left": args.window_left == a["window_left"],
        "window_right": args.window_right == a["window_right"],
        # the softcap's factor replaces the scale's in scale_log2
        "softcap": (args.softcap, args.scale_log2) == (a["softcap"], a["softcap"] * LOG2_E),
        "alibi_slopes": (args.alibi_slopes, args.alibi_batch_stride)
        == (a["alibi_slopes"].data_ptr(), 6),
        "attn_bias": (args.attn_bias, args.attn_bias_batch_stride, args.attn_bias_head_stride,
                      args.attn_bias_row_stride) == (a["attn_bias"].data_ptr(),
                                                     *a["attn_bias"].stride()[:3]),
        "sinks": args.sinks == a["sinks"].data_ptr(),
        **{f"variant_tensor{i}": slot_holds(args, i, t) for i, t in enumerate(tensors)},
        "mask_ranges": args.mask_ranges == a["mask_ranges"].data_ptr(),
        "dropout_p": args.dropout_p == pytest.approx(a["dropout_p"]),
        "dropout_seed": args.dropout_seed == a["dropout_seed"].data_ptr(),
        "cu_seqlens_q": (args.cu_seqlens_q, args.batch) == (a["cu_seqlens_q"].data_ptr(), 2),
        "cu_seqlens_k": args.cu_seqlens_k == a["cu_seqlens_k"].data_ptr(),
        "max_seqlen_q": args.seqlen_q == a["max_seqlen_q"],
        "max_seqlen_k": args.seqlen_k == a["max_seqlen_k"],
    }


def heads_first_strides(t) -> tuple:
    batch, seq, heads, dim = t.shape
    return (heads * seq * dim, dim, seq * dim, 1)


def test_every_fwd_and_bwd_argument_reaches_the_kernels_params(mocked):
    a = fwd_values()
    out, lse = OP[FWD](*(a[name] for name in OPS[FWD].names))
    dout = torch.randn(out.shape, dtype=out.dtype)
    out.backward(dout)

    fwd = launched(mocked, FWD)
    (plan,) = mocked.fwd_plans
    reached = {
        **shared_fields_hold(fwd, a),
        "mask": plan["mask"] == a["mask"],
        "variant": plan["score_mod"] == a["variant"],  # a variant with a score_mod
        "heads_first": pointer_and_strides(fwd, "o", out)
        and out.stride() == heads_first_strides(out),
        # consumed by the backward alone (below); seqused_k: its own test
        "deterministic": True, "seqused_k": True,
    }
    assert plan["dropout"] is True and plan["reads"] == "varlen"
    assert fwd.softmax_lse == lse.data_ptr()
    assert reached == dict.fromkeys(OPS[FWD].names, True)

    bwd = launched(mocked, BWD)
    (choice,) = mocked.bwd_choices
    reached = {
        **shared_fields_hold(bwd, a),
        "dout": pointer_and_strides(bwd, "dout", dout, prefix="do"),
        "out": pointer_and_strides(bwd, "o", out),
        "lse": bwd.softmax_lse == lse.data_ptr(),
        "attn_bias_grad": bwd.attn_bias_grad == a["attn_bias"].grad.data_ptr()
        and choice["attn_bias_grad"] is True,
        "mask": choice["mask"] == a["mask"],
        "variant": choice["score_mod"] == a["variant"],
        "deterministic": bwd.dq_accum == 0,  # the deterministic path adds no dq workspace
        "heads_first": all(getattr(bwd, f"{name}_row_stride") == HEAD_DIM
                           for name in ("dq", "dk", "dv")),
    }
    assert choice["dropout"] is True and choice["varlen"] is True
    assert reached == dict.fromkeys(OPS[BWD].names, True)
    assert all(t.grad is not None for t in (a["q"], a["k"], a["v"], a["attn_bias"], a["sinks"]))


def test_seqused_k_reaches_the_forwards_params(mocked):
    a = {**fwd_values(), "seqused_k": torch.tensor([2, 7], dtype=torch.int32)}
    with torch.no_grad():
        OP[FWD](*(a[n] for n in OPS[FWD].names))
    assert launched(mocked, FWD).seqused_k == a["seqused_k"].data_ptr()


def test_attentions_call_takes_each_argument_from_band_mods_and_varlen(monkeypatch):
    """ops.attention's tuple (op_schema.fwd_arguments), read back by name."""
    from flashgen.band import Band
    from flashgen.modifiers import Modifiers
    from flashgen import variants

    a = fwd_values()
    tensors = tuple(a[f"variant_tensor{i}"] for i in range(params.VARIANT_TENSORS))
    mods = Modifiers(softcap=a["softcap"], alibi_slopes=a["alibi_slopes"],
                     attn_bias=a["attn_bias"], sinks=a["sinks"],
                     variant=variants.resolve(a["variant"]),
                     variant_tensors=tensors[:2], mask_ranges=a["mask_ranges"],
                     dropout_p=a["dropout_p"], dropout_seed=a["dropout_seed"])
    band = Band(a["mask_offset"], a["window_left"], a["window_right"])
    varlen = (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"])
    call = OPS[FWD].view(fwd_arguments(a["q"], a["k"], a["v"], a["scale"], a["mask"], band,
                                       a["deterministic"], a["heads_first"], mods, varlen))
    assert call._asdict() == {**a, "variant_tensor2": None, "variant_tensor3": None}
    dense = fwd_arguments(a["q"], a["k"], a["v"], a["scale"], a["mask"], band,
                          a["deterministic"], a["heads_first"], mods, ())
    # the dispatcher's own form of a call that leaves the defaults: without them
    assert dense == tuple(call)[:len(dense)] and len(dense) == len(call) - len(OPS[FWD].defaults)


# --- fwd_kvcache and mask_ranges --------------------------------------------------------------

def test_every_fwd_kvcache_argument_reaches_the_kernels_params(mocked):
    batch, new, page = 2, 3, 16
    tensors = variant_tensors()
    # queries packed as flash_attn_varlen_func's over a paged cache: 2 and 3 rows
    a = dict(
        q=torch.randn(1, 5, HEADS, HEAD_DIM, dtype=torch.bfloat16),
        k_cache=torch.zeros(6, page, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16),
        v_cache=torch.zeros(7, page, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16)[1:],
        k_new=torch.randn(batch, new, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16),
        v_new=torch.randn(batch, new, HEADS_KV, 2 * HEAD_DIM, dtype=torch.bfloat16)[..., :64],
        rotary_cos=torch.randn(48, 8, dtype=torch.bfloat16),
        rotary_sin=torch.randn(48, 8, dtype=torch.bfloat16),
        cache_seqlens=torch.tensor([5, 20], dtype=torch.int32),
        cache_batch_idx=torch.tensor([1, 0], dtype=torch.int32),
        cache_leftpad=torch.tensor([3, 1], dtype=torch.int32),
        block_table=torch.arange(10, dtype=torch.int32).view(batch, 5)[:, :3],
        scale=0.3, window_left=13, window_right=9, softcap=5.5,
        alibi_slopes=torch.randn(batch, 6)[:, :HEADS], sinks=torch.randn(HEADS),
        rotary_interleaved=False, num_splits=3, variant="relative_bias",
        **{f"variant_tensor{i}": t for i, t in enumerate(tensors)},
        cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32), max_seqlen_q=new)
    out, lse = OP[FWD_KVCACHE](*(a[name] for name in OPS[FWD_KVCACHE].names))

    args = launched(mocked, FWD_KVCACHE)
    (plan,) = mocked.decode_plans
    capacity = 3 * page
    reached = {
        "q": pointer_and_strides(args, "q", a["q"]),
        "k_cache": pointer_and_strides(args, "k", a["k_cache"]),
        "v_cache": pointer_and_strides(args, "v", a["v_cache"]),
        "k_new": pointer_and_strides(args, "k_new", a["k_new"]) and args.seqlen_new == new,
        "v_new": pointer_and_strides(args, "v_new", a["v_new"]),
        "rotary_cos": (args.rotary_cos, args.rotary_dim) == (a["rotary_cos"].data_ptr(), 16),
        "rotary_sin": args.rotary_sin == a["rotary_sin"].data_ptr(),
        "cache_seqlens": args.cache_seqlens == a["cache_seqlens"].data_ptr(),
        "cache_batch_idx": args.cache_batch_idx == a["cache_batch_idx"].data_ptr(),
        "cache_leftpad": args.cache_leftpad == a["cache_leftpad"].data_ptr(),
        "block_table": (args.block_table, args.block_table_batch_stride, args.page_size,
                        args.seqlen_k) == (a["block_table"].data_ptr(), 5, page, capacity),
        "scale": args.softmax_scale == pytest.approx(a["scale"]),
        # aligned bottom-right to the cache: mask_offset is the capacity less the new rows
        "window_left": (args.window_left, args.mask_offset) == (13, capacity - new),
        "window_right": args.window_right == a["window_right"],
        "softcap": (args.softcap, args.scale_log2) == (a["softcap"], a["softcap"] * LOG2_E),
        "alibi_slopes": (args.alibi_slopes, args.alibi_batch_stride)
        == (a["alibi_slopes"].data_ptr(), 6),
        "sinks": args.sinks == a["sinks"].data_ptr(),
        "rotary_interleaved": args.rotary_interleaved == 0,
        "num_splits": args.num_splits == a["num_splits"] and args.o_accum != 0,
        "variant": plan["score_mod"] == a["variant"],
        **{f"variant_tensor{i}": slot_holds(args, i, t) for i, t in enumerate(tensors)},
        "cu_seqlens_q": (args.cu_seqlens_q, args.batch) == (a["cu_seqlens_q"].data_ptr(), batch),
        "max_seqlen_q": args.seqlen_q == new,
    }
    assert reached == dict.fromkeys(OPS[FWD_KVCACHE].names, True)
    assert lse.shape == (1, HEADS, 5)  # packed queries' statistics: (heads, total rows)
    assert pointer_and_strides(args, "o", out) and args.softmax_lse == lse.data_ptr()


@pytest.mark.parametrize("entry", ["op", "ops.mask_ranges"])
def test_every_mask_ranges_argument_reaches_the_kernels_params(mocked, entry):
    """Through the op, and through ops.mask_ranges (variants.py's call, by keyword)."""
    tensors = variant_tensors()
    a = dict(q=torch.randn(1, 8, HEADS, HEAD_DIM, dtype=torch.bfloat16),
             k=torch.randn(1, 13, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16), variant="document",
             **{f"variant_tensor{i}": t for i, t in enumerate(tensors)},
             cu_seqlens_q=torch.tensor(CU_SEQLENS_Q, dtype=torch.int32),
             cu_seqlens_k=torch.tensor(CU_SEQLENS_K, dtype=torch.int32),
             max_seqlen_q=MAX_SEQLEN_Q, max_seqlen_k=MAX_SEQLEN_K)
    if entry == "op":
        ranges = OP[MASK_RANGES](*(a[name] for name in OPS[MASK_RANGES].names))
    else:
        ranges = ops.mask_ranges(a["variant"], a["q"], a["k"], tuple(tensors),
                                 (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"],
                                  a["max_seqlen_k"]))

    args = launched(mocked, MASK_RANGES)
    (plan,) = mocked.fwd_plans  # the variant's forward kernel holds its mask-range kernels
    reached = {
        "q": pointer_and_strides(args, "q", a["q"]),
        "k": pointer_and_strides(args, "k", a["k"]),
        "variant": plan["mask"] == a["variant"] and args.mask_ranges == ranges.data_ptr(),
        **{f"variant_tensor{i}": slot_holds(args, i, t) for i, t in enumerate(tensors)},
        "cu_seqlens_q": (args.cu_seqlens_q, args.batch) == (a["cu_seqlens_q"].data_ptr(), 2),
        "cu_seqlens_k": args.cu_seqlens_k == a["cu_seqlens_k"].data_ptr(),
        "max_seqlen_q": args.seqlen_q == a["max_seqlen_q"],
        "max_seqlen_k": args.seqlen_k == a["max_seqlen_k"],
    }
    assert reached == dict.fromkeys(OPS[MASK_RANGES].names, True)
