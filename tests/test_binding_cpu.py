"""The pybind11 binding on a CPU: what forward.run, backward.run and decode.decode pass reaches
the launcher in the right FwdParams / BwdParams / DecodeParams members, every member from its own argument (no two sizes or
strides are equal), and ctypes structures made from codegen/params.py's table match params.h.
The launcher is a Python function behind a C function pointer that copies the params it gets; the
binding is built with the host compiler (seconds)."""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import math
import os
import re
import shutil
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pybind11")
if shutil.which(os.environ.get("CXX", "c++")) is None:
    pytest.skip("no host C++ compiler to build the binding", allow_module_level=True)

from codegen import build, params, paths  # noqa: E402
from codegen.families import FAMILIES  # noqa: E402
from codegen.families.mma import resources  # noqa: E402
from codegen.masks import MASKS  # noqa: E402
from flashgen import backward, decode, forward, host, loader  # noqa: E402
from flashgen import schedule  # noqa: E402
from flashgen.band import Band  # noqa: E402
from flashgen.families import hopper, mma  # noqa: E402

STRIDE_NAMES = ("batch", "row", "head")
CTYPES = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}


def ctypes_structure(name: str, fields_) -> type:
    """A ctypes mirror of one params struct, from the table's members."""
    members = [(member, ctypes.c_void_p if ctype.endswith("*") else CTYPES[ctype])
               for ctype, member in params.members(fields_)]
    return type(name, (ctypes.Structure,), {"_fields_": members})


FwdParams = ctypes_structure("FwdParams", params.FWD_FIELDS)
BwdParams = ctypes_structure("BwdParams", params.BWD_FIELDS)
DecodeParams = ctypes_structure("DecodeParams", params.DECODE_FIELDS)


@pytest.fixture(scope="module")
def binding_cache(tmp_path_factory):
    """The build cache of this module's binding."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def built_binding(binding_cache):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLASHGEN_CACHE_DIR", str(binding_cache))
        path = build.build_binding(log=lambda message: None)
    spec = importlib.util.spec_from_file_location("_flashgen_binding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingLauncher:
    """A loader.Launcher stand-in whose address calls back into Python: keeps a copy of the params
    and the stream of each launch, and returns `error` (0: success). `spec`: the KernelSpec
    fields the caller reads (a mask brings its kind)."""

    def __init__(self, params_type, error: int = 0, **spec):
        self.launches = []
        if "mask" in spec:
            spec["mask_kind"] = MASKS[spec["mask"]]
        self.spec = SimpleNamespace(**spec)

        def launch(params, stream):
            self.launches.append((params_type.from_buffer_copy(params.contents), stream))
            return error

        function_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(params_type),
                                         ctypes.c_void_p)
        self._callback = function_type(launch)  # kept alive as long as the address is used
        self.address = ctypes.cast(self._callback, ctypes.c_void_p).value
        libc = ctypes.CDLL(None)
        self.error_string_address = ctypes.cast(libc.strerror, ctypes.c_void_p).value


@pytest.fixture
def binding(built_binding, monkeypatch):
    """The built binding behind loader.binding(); stream 77 current on the tensors' (CPU) device."""
    monkeypatch.setattr(loader, "_binding", built_binding)
    monkeypatch.setattr(host, "_current_stream", lambda device_index: 77)
    monkeypatch.setattr(host, "_current_device", lambda: -1)  # a CPU tensor's get_device()
    monkeypatch.setattr(host, "stream_capturing", lambda: False)


def distinct_strides(*shapes):
    """(batch, seq, heads, dim) bf16 views of these shapes, head dim contiguous, whose
    (batch, row, head) strides all differ, within a tensor and across them (the views overlap
    their rows: the launcher only records)."""
    values = itertools.count(1000, 8)
    views = []
    for shape in shapes:
        strides = (next(values), next(values), next(values), 1)
        size = 1 + sum((n - 1) * stride for n, stride in zip(shape, strides))
        views.append(torch.empty(size, dtype=torch.bfloat16).as_strided(shape, strides))
    return views


def fields(params) -> dict:
    """Every field of a ctypes params structure, by name."""
    return {name: getattr(params, name) for name, _ in params._fields_}


def tensor_fields(**tensors) -> dict:
    """The data pointer and (batch, row, head) stride fields of each (batch, seq, heads, dim)
    tensor, named by its fields' prefix (do's pointer field is dout)."""
    filled = {}
    for prefix, t in tensors.items():
        filled["dout" if prefix == "do" else prefix] = t.data_ptr()
        filled.update({f"{prefix}_{s}_stride": n for s, n in zip(STRIDE_NAMES, t.stride())})
    return filled


def problem_fields(q, k, scale, band) -> dict:
    """The size, scale and mask fields that every params structure has."""
    batch, seqlen_q, heads, _ = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    return dict(batch=batch, heads=heads, heads_kv=heads_kv, seqlen_q=seqlen_q,
                seqlen_k=seqlen_k, softmax_scale=scale,
                scale_log2=ctypes.c_float(scale * math.log2(math.e)).value,
                **band.fields(), softcap=0.0, alibi_slopes=None, alibi_batch_stride=0,
                attn_bias=None, attn_bias_batch_stride=0, attn_bias_head_stride=0,
                attn_bias_row_stride=0, mask_ranges=None, **NO_VARIANT_TENSORS, dropout_p=0.0,
                dropout_seed=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                sinks=None)


# Unused variant tensor slots: null, every size 1.
NO_VARIANT_TENSORS = {
    name: value for i in range(params.VARIANT_TENSORS)
    for name, value in [(f"variant_tensor{i}", None),
                        *((f"variant_size{i}_{d}", 1) for d in range(params.VARIANT_RANK))]}


def ctypes_fields(declaration: str) -> list[tuple[str, type]]:
    """(name, ctypes type) of each field of one struct declared in params.h, in order."""
    kinds = CTYPES
    declared = []
    for statement in re.sub(r"//[^\n]*", "", declaration).split(";")[:-1]:
        kind, names = re.fullmatch(r"\s*((?:const )?\w+\*?) (.+)", statement, re.S).groups()
        kind = ctypes.c_void_p if kind.endswith("*") else kinds[kind]
        declared += [(name.strip(), kind) for name in names.split(",")]
    return declared


@pytest.mark.parametrize("params_type", [FwdParams, BwdParams, DecodeParams],
                         ids=lambda t: t.__name__)
def test_the_ctypes_structures_mirror_params_h(params_type):
    text = (paths.INCLUDE_DIR / params.HEADER).read_text()

    def declared(struct: str) -> list:
        body = re.search(rf"struct {struct}(?: : \w+)? {{(.*?)\n}};", text, re.S).group(1)
        return ctypes_fields(body)

    assert params_type._fields_ == declared(params.BASE) + declared(params_type.__name__)


# Sizes, mask band and grid orders all different, so that no field passes with another's value.
BATCH, HEADS, HEADS_KV, SEQLEN_Q, SEQLEN_K, RANKS_PER_ROUND = 3, 6, 2, 5, 9, 7
BAND = Band(offset=4, left=13, right=8)
BWD_GRID = schedule.BwdGrid(sorted_tail_blocks=11, split_blocks=3, splits=5)
BLOCK_N = 128
Q_SHAPE, KV_SHAPE = (BATCH, SEQLEN_Q, HEADS, 64), (BATCH, SEQLEN_K, HEADS_KV, 64)
LSE_SHAPE = (BATCH, HEADS, SEQLEN_Q)


@pytest.mark.parametrize("family, mask", [("mma", "causal"), ("hopper", "none"),
                                          ("hopper", "causal")])
def test_forward_launch_fills_every_field(binding, monkeypatch, family, mask):
    """A family with a tile counter gets a fresh one per call under a mask that hides keys (the
    launcher zeroes it); other calls pass nullptr."""
    q, k, v, o = distinct_strides(Q_SHAPE, KV_SHAPE, KV_SHAPE, Q_SHAPE)
    lse = torch.empty(LSE_SHAPE)
    launcher = RecordingLauncher(FwdParams, family_record=FAMILIES[family], mask=mask)
    workspaces = record_empty(monkeypatch)
    forward.run(launcher, q, k, v, o, lse, 0.125, BAND,
                {"ranks_per_round": RANKS_PER_ROUND})
    ((params, stream),) = launcher.launches
    assert stream == 77
    if family == "hopper" and mask == "causal":
        (counter,) = workspaces
        assert counter.dtype == torch.int32 and counter.numel() == 1
        tile_counter = counter.data_ptr()
    else:
        assert workspaces == []
        tile_counter = None  # ctypes reads a null pointer as None
    assert fields(params) == {**tensor_fields(q=q, k=k, v=v, o=o), "softmax_lse": lse.data_ptr(),
                              **problem_fields(q, k, 0.125, BAND),
                              "ranks_per_round": RANKS_PER_ROUND, "tile_counter": tile_counter,
                              "q_view_batch": BATCH, "q_view_rows": SEQLEN_Q,
                              "kv_view_batch": BATCH, "kv_view_rows": SEQLEN_K,
                              **NO_DESCALES, **NO_CACHE}


# FwdParams' descales outside an e4m3 forward.
NO_DESCALES = {f"{name}_descale{part}": None if not part else 0
               for name in "qkv" for part in ("", "_batch_stride", "_head_stride")}


# FwdParams' KV-cache fields when k and v are not a cache.
NO_CACHE = {"cache_seqlens": None, "cache_batch_idx": None, "cache_leftpad": None,
            "block_table": None,
            "block_table_batch_stride": 0, "page_size": 0, "seqlen_new": 0}


def test_forward_launch_failure_raises_with_the_error_string(binding):
    (q,) = distinct_strides((1, 4, 1, 64))
    launcher = RecordingLauncher(FwdParams, error=2, family_record=FAMILIES["mma"], mask="none")
    with pytest.raises(RuntimeError, match=f"kernel launch failed: {os.strerror(2)}"):
        forward.run(launcher, q, q, q, torch.empty_like(q), torch.empty(1, 1, 4), 0.125, Band(),
                    {})


def record_empty(monkeypatch) -> list:
    """The tensors torch.empty makes from here on, in order (the backward's workspaces)."""
    made, empty = [], torch.empty

    def recording_empty(*args, **kwargs):
        made.append(empty(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(torch, "empty", recording_empty)
    return made


def run_backward(monkeypatch, launcher, deterministic):
    """backward.run on distinct-strided views through a recording launcher: (the views, lse, the
    params it launched with, the fp32 scratch it allocated)."""
    shapes = {"q": Q_SHAPE, "k": KV_SHAPE, "v": KV_SHAPE, "o": Q_SHAPE, "do": Q_SHAPE,
              "dq": Q_SHAPE, "dk": KV_SHAPE, "dv": KV_SHAPE}
    tensors = dict(zip(shapes, distinct_strides(*shapes.values())))
    lse = torch.empty(LSE_SHAPE)
    workspaces = record_empty(monkeypatch)
    backward.run(launcher, tensors["q"], tensors["k"], tensors["v"], tensors["o"],
                 tensors["do"], lse, tensors["dq"], tensors["dk"], tensors["dv"], 0.125,
                 BAND, deterministic)
    ((params, stream),) = launcher.launches
    assert stream == 77
    (scratch,) = workspaces
    return tensors, lse, params, scratch


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_launch_fills_every_field(binding, monkeypatch, deterministic):
    launcher = RecordingLauncher(BwdParams, family="mma", mask="none",
                                 tile=SimpleNamespace(block_n=BLOCK_N))
    monkeypatch.setattr(mma, "backward_grid", lambda *_: BWD_GRID)
    tensors, lse, params, scratch = run_backward(monkeypatch, launcher, deterministic)
    # One fp32 scratch: dQ's workspace (rows x padded head dim, none when deterministic), the
    # split blocks' dK, dV and counter (BwdTraits::kSplitFloats each), then D.
    rows = math.prod(LSE_SHAPE)
    dq_floats = 0 if deterministic else rows * resources.padded_head_dim(64)
    split_floats = BWD_GRID.split_blocks * (2 * BLOCK_N * 64 + 1)
    assert (scratch.shape, scratch.dtype) == ((dq_floats + split_floats + rows,), torch.float32)
    assert fields(params) == {
        **tensor_fields(**tensors), "softmax_lse": lse.data_ptr(),
        "softmax_d": scratch.data_ptr() + 4 * (dq_floats + split_floats),
        # ctypes reads a null pointer as None
        "dq_accum": None if deterministic else scratch.data_ptr(),
        "dkv_accum": scratch.data_ptr() + 4 * dq_floats,
        "softmax_lse_log2": None, "dq_semaphore": None, "dq_state": None,  # the hopper family's
        "deterministic_rotation": 0,
        **problem_fields(tensors["q"], tensors["k"], 0.125, BAND),
        **BWD_GRID._asdict(), "attn_bias_grad": None, **DENSE_VIEWS}


# BwdParams' packed-view rows for a dense batch (the hopper family's TMA bounds).
DENSE_VIEWS = {"q_view_rows": 0, "kv_view_rows": 0}


@pytest.mark.parametrize("deterministic", [False, True])
def test_hopper_backward_launch_fills_every_field(binding, monkeypatch, deterministic):
    block_m = 64
    launcher = RecordingLauncher(BwdParams, family="hopper", mask="none",
                                 tile=SimpleNamespace(block_m=block_m, block_n=BLOCK_N))
    # (a deterministic grid is never split)
    grid = schedule.BwdGrid() if deterministic else BWD_GRID
    monkeypatch.setattr(hopper, "backward_grid", lambda *_: grid)
    # an H100's 132 SMs: a head's key blocks are few beside them, so a deterministic run without
    # a mask walks rotated, its dQ turns in the order the key blocks arrive
    monkeypatch.setattr(host, "device_resources", lambda device_index: (132, 50 << 20))
    tensors, lse, params, scratch = run_backward(monkeypatch, launcher, deterministic)
    # One fp32 scratch, rows padded to whole query blocks per (batch, head): dQ's workspace, D,
    # lse * log2(e), then an int per query block and consumer warpgroup (deterministic: the order
    # of dQ's adds) or per query block padded to 16 bytes (dQ's state), then the split blocks'
    # dK, dV and counter (BwdTraits::kSplitFloats each).
    query_blocks = BATCH * HEADS * -(-SEQLEN_Q // block_m)
    rows = query_blocks * block_m
    order_ints = query_blocks * (BLOCK_N // 64) if deterministic else -(-query_blocks // 4) * 4
    split_floats = grid.split_blocks * (2 * BLOCK_N * 64 + 1)
    assert (scratch.shape, scratch.dtype) == ((rows * (64 + 2) + order_ints + split_floats,),
                                              torch.float32)
    order = scratch.data_ptr() + 4 * rows * 66
    assert fields(params) == {
        **tensor_fields(**tensors), "softmax_lse": lse.data_ptr(),
        "dq_accum": scratch.data_ptr(), "softmax_d": scratch.data_ptr() + 4 * rows * 64,
        "softmax_lse_log2": scratch.data_ptr() + 4 * rows * 65,
        "dq_semaphore": order if deterministic else None,
        "dq_state": None if deterministic else order,
        "dkv_accum": order + 4 * order_ints if split_floats else None,
        "deterministic_rotation": int(deterministic),
        **grid._asdict(), "attn_bias_grad": None,
        **problem_fields(tensors["q"], tensors["k"], 0.125, BAND), **DENSE_VIEWS}


# A packed batch of three sequences (one without queries) and its longest lengths as passed.
PACKED_Q, PACKED_K, LONGEST_Q, LONGEST_K = [70, 0, 300], [9, 130, 500], 305, 500


def run_packed_backward(monkeypatch, launcher) -> tuple[dict, torch.Tensor, dict]:
    """backward.run on a packed batch through a recording launcher: (the params' fields, the
    fp32 scratch, the fields a packed batch sets)."""
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (PACKED_Q, PACKED_K))
    q_shape, kv_shape = (1, sum(PACKED_Q), HEADS, 64), (1, sum(PACKED_K), HEADS_KV, 64)
    shapes = [q_shape, kv_shape, kv_shape, q_shape, q_shape, q_shape, kv_shape, kv_shape]
    q, k, v, o, do, dq, dk, dv = distinct_strides(*shapes)
    lse = torch.empty(HEADS, sum(PACKED_Q))
    workspaces = record_empty(monkeypatch)
    backward.run(launcher, q, k, v, o, do, lse, dq, dk, dv, 0.125, BAND, False,
                 (cu_q, cu_k, LONGEST_Q, LONGEST_K))
    ((params, _),) = launcher.launches
    (scratch,) = workspaces
    packed = {"batch": 3, "seqlen_q": LONGEST_Q, "seqlen_k": LONGEST_K,
              "q_view_rows": sum(PACKED_Q), "kv_view_rows": sum(PACKED_K),
              "cu_seqlens_q": cu_q.data_ptr(), "cu_seqlens_k": cu_k.data_ptr()}
    return fields(params), scratch, packed


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_hopper_backward_launch_lays_a_packed_batch_out_by_its_rows(binding, monkeypatch, mask):
    """A variable-length batch: the grid of a dense batch of its longest lengths, the packed
    views' rows bounding the TMA descriptors, each sequence's offsets from cu_seqlens, and
    workspaces of the sequences' own query blocks: per head, the total rows plus a query block
    per sequence (QueryBlockLayout)."""
    block_m = 64
    launcher = RecordingLauncher(BwdParams, family="hopper", mask=mask,
                                 tile=SimpleNamespace(block_m=block_m, block_n=BLOCK_N))
    monkeypatch.setattr(host, "device_resources", lambda device_index: (132, 50 << 20))
    got, scratch, packed = run_packed_backward(monkeypatch, launcher)
    assert {name: got[name] for name in packed} == packed
    grid = hopper.backward_grid(launcher.spec, (3, LONGEST_Q, HEADS, 64), (LONGEST_K, HEADS_KV),
                                0, False)
    assert {name: got[name] for name in grid._fields} == grid._asdict()
    # (without a mask 24 key blocks, all in the last wave, run in pieces)
    assert (grid.splits > 1) == (mask == "none")
    query_blocks = HEADS * ((sum(PACKED_Q) + 3 * block_m) // block_m)
    split_floats = grid.split_blocks * (2 * BLOCK_N * 64 + 1)
    assert scratch.numel() == (query_blocks * block_m * (64 + 2) + -(-query_blocks // 4) * 4
                               + split_floats)


def test_mma_backward_launch_lays_a_packed_batch_out_by_its_rows(binding, monkeypatch):
    """The mma family's dQ workspace and D of a packed batch: (heads, total rows), which the
    launcher zeroes by q_view_rows, not batch x heads x the longest rows."""
    launcher = RecordingLauncher(BwdParams, family="mma", mask="none",
                                 tile=SimpleNamespace(block_m=64, block_n=BLOCK_N))
    monkeypatch.setattr(mma, "backward_grid", lambda *_: schedule.BwdGrid())
    got, scratch, packed = run_packed_backward(monkeypatch, launcher)
    assert {name: got[name] for name in packed} == packed
    rows = HEADS * sum(PACKED_Q)
    assert scratch.numel() == rows * resources.padded_head_dim(64) + rows


def test_hopper_deterministic_walks_rotate_where_heads_of_key_blocks_share_a_wave(monkeypatch):
    """Without a mask a deterministic run's key blocks walk rotated, each query block's dQ turns
    in the order they arrive, only where a head's key blocks fill at most a quarter of the SMs
    (a block may then wait on any block of its head, and a head that starts late in a wave holds
    few SMs waiting); under a mask, or with more, they walk in order."""
    monkeypatch.setattr(host, "device_resources", lambda device_index: (132, 50 << 20))
    none, causal = (SimpleNamespace(mask_kind=MASKS[mask], tile=SimpleNamespace(block_n=128))
                    for mask in ("none", "causal"))
    assert hopper.deterministic_rotation(none, 33 * 128, 0) == 1
    assert hopper.deterministic_rotation(none, 33 * 128 + 1, 0) == 0
    assert hopper.deterministic_rotation(causal, 1024, 0) == 0


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_decode_launch_fills_every_field(binding, monkeypatch, paged):
    """Append (k, v, rotary) and split: every DecodeParams member from its own argument; the
    split workspace is the stream's scratch."""
    new_tokens, splits, page, rotary_half = 4, 11, 16, 16
    cache_shape = (7, page, HEADS_KV, 64) if paged else (BATCH + 1, 40, HEADS_KV, 64)
    q, k_new, v_new, k_cache, v_cache = distinct_strides(
        Q_SHAPE, (BATCH, new_tokens, HEADS_KV, 64), (BATCH, new_tokens, HEADS_KV, 64),
        cache_shape, cache_shape)
    table = torch.zeros(BATCH, 8, dtype=torch.int32)[:, :3] if paged else None
    capacity = 3 * page if paged else 40
    cos, sin = torch.empty(capacity, rotary_half), torch.empty(capacity, rotary_half)
    seqlens = torch.zeros(BATCH, dtype=torch.int32)
    rows = None if paged else torch.zeros(BATCH, dtype=torch.int32)
    launcher = RecordingLauncher(DecodeParams, tile=SimpleNamespace(block_m=64))
    monkeypatch.setattr(decode, "_plan", lambda *_: (launcher, 264))
    monkeypatch.setattr(decode, "_padded_head_dim", lambda *_: None)  # its own kernels
    made, empty_like = record_empty(monkeypatch), torch.empty_like
    made_like = []
    monkeypatch.setattr(torch, "empty_like",
                        lambda *a, **k: made_like.append(empty_like(*a, **k)) or made_like[-1])
    out, lse = decode.decode(q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens, rows, None,
                             table, 0.125, 13, 0, 0.0, None, None, False, splits)
    ((params, stream),) = launcher.launches
    assert stream == 77
    (lse_made, *_), (out_made, q_rot) = made, made_like
    assert out_made is out and lse_made is lse
    # a CPU tensor's device index, the stream
    counters, workspace = decode._split_counters[(-1, 77)], decode._scratch[(-1, 77)]
    rows_per_split = BATCH * HEADS * SEQLEN_Q
    # o_accum (splits, batch, heads, seqlen_q, 64), then lse_accum (splits, batch, heads, seqlen_q)
    assert workspace.numel() >= splits * rows_per_split * 65 and q_rot.shape == q.shape
    assert fields(params) == {
        **tensor_fields(q=q, k=k_cache, v=v_cache, o=out, k_new=k_new, v_new=v_new, q_rot=q_rot),
        **problem_fields(q, k_cache, 0.125, Band(capacity - SEQLEN_Q, 13, 0)),
        "seqlen_k": capacity,
        "softmax_lse": lse.data_ptr(), "num_splits": splits, "o_accum": workspace.data_ptr(),
        "lse_accum": workspace.data_ptr() + 4 * splits * rows_per_split * 64,
        "cache_seqlens": seqlens.data_ptr(),
        # ctypes reads a null pointer as None
        "cache_batch_idx": None if paged else rows.data_ptr(), "cache_leftpad": None,
        "block_table": table.data_ptr() if paged else None,
        "block_table_batch_stride": 8 if paged else 0, "page_size": page if paged else 0,
        "seqlen_new": new_tokens, "rotary_cos": cos.data_ptr(), "rotary_sin": sin.data_ptr(),
        "rotary_dim": 2 * rotary_half, "rotary_interleaved": 0, "min_seqlen_q": 0,
        "q_view_rows": 0,
        # one per (query block, sequence and KV head), the stream's, at 0
        "split_counters": counters.data_ptr(), "split_counter_count": BATCH * HEADS_KV}
    assert not counters.any()


def test_a_mixed_varlen_batch_launches_its_prefill_and_decode_sequences_apart(binding,
                                                                               monkeypatch):
    """A packed batch whose longest sequence takes the prefill tile: one launch for the sequences
    of more than decode_tokens queries, one on the decode tile for the rest, each with its own
    split, sharing the output, lse and the split workspaces; both launch over the packed rows
    (q_view_rows), and the prefill launch splits as its longest sequence alone would."""
    lengths = [300, 1, 4, 0, 37]
    total, heads, heads_kv, page = sum(lengths), 8, 2, 16
    q = torch.empty(1, total, heads, 64, dtype=torch.float16)
    k_cache = torch.empty(40, page, heads_kv, 64, dtype=torch.float16)
    table = torch.zeros(len(lengths), 8, dtype=torch.int32)
    cu_seqlens_q = torch.tensor([0, 300, 301, 305, 305, 342], dtype=torch.int32)
    prefill_tile = RecordingLauncher(DecodeParams, tile=SimpleNamespace(block_m=128, block_n=32))
    decode_tile = RecordingLauncher(DecodeParams, tile=SimpleNamespace(block_m=64, block_n=64))
    monkeypatch.setattr(decode, "_plan", lambda *args: (prefill_tile if args[4] else decode_tile,
                                                        264))
    monkeypatch.setattr(decode, "_padded_head_dim", lambda *_: None)
    decode.decode(q, k_cache, k_cache, None, None, None, None, None, None, None, table, 0.125,
                  decode.WINDOW_UNBOUNDED, 0, 0.0, None, None, False, 0, cu_seqlens_q=cu_seqlens_q,
                  max_seqlen_q=300)
    decode_tokens = decode.mixed_decode_tokens(len(lengths), total, 300, heads // heads_kv)
    assert decode_tokens == 63
    ((prefill, _),), ((short, _),) = prefill_tile.launches, decode_tile.launches
    assert (prefill.min_seqlen_q, prefill.seqlen_q) == (decode_tokens + 1, 300)
    assert (short.min_seqlen_q, short.seqlen_q) == (0, decode_tokens)
    assert prefill.o == short.o and prefill.softmax_lse == short.softmax_lse
    assert short.num_splits > 1 and short.o_accum == prefill.o_accum != 0
    assert prefill.q_view_rows == short.q_view_rows == total

    prefill_tile.launches.clear()
    decode.decode(q[:, :300], k_cache, k_cache, None, None, None, None, None, None, None,
                  table[:1], 0.125, decode.WINDOW_UNBOUNDED, 0, 0.0, None, None, False, 0,
                  cu_seqlens_q=cu_seqlens_q[:2], max_seqlen_q=300)
    ((alone, _),) = prefill_tile.launches
    assert alone.num_splits == prefill.num_splits


def test_a_repeated_decode_step_reuses_its_plan_with_each_calls_tensors(binding, monkeypatch):
    """A call of the same shapes, strides, dtypes and numbers as an earlier one plans nothing: it
    launches the earlier plan's params with its own tensors' addresses, as planning it afresh
    would; its outputs and split workspace are its own."""
    launcher = RecordingLauncher(DecodeParams,
                                 tile=SimpleNamespace(block_m=64, block_n=64))
    monkeypatch.setattr(decode, "_plan", lambda *_: (launcher, 264))
    monkeypatch.setattr(decode, "_padded_head_dim", lambda *_: None)
    plans, make_plan = [], decode._make_plan
    monkeypatch.setattr(decode, "_make_plan", lambda *a: plans.append(1) or make_plan(*a))

    def step():
        q = torch.empty(2, 1, 8, 64, dtype=torch.float16)
        k_cache, v_cache = (torch.empty(7, 16, 2, 64, dtype=torch.float16) for _ in range(2))
        seqlens = torch.tensor([5, 40], dtype=torch.int32)
        table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
        sinks = torch.nn.Parameter(torch.empty(8))  # learnable, as models hold them
        out, lse = decode.decode(q, k_cache, v_cache, None, None, None, None, seqlens, None,
                                 None, table, 0.125, decode.WINDOW_UNBOUNDED, 0, 0.0, None,
                                 sinks, False, 3)
        ((params, _),) = launcher.launches
        launcher.launches.clear()
        expected = tensor_fields(q=q, k=k_cache, v=v_cache, o=out)
        expected.update(softmax_lse=lse.data_ptr(), cache_seqlens=seqlens.data_ptr(),
                        block_table=table.data_ptr(), sinks=sinks.data_ptr())
        return fields(params), expected, (q, k_cache, v_cache, seqlens, table, sinks, out, lse)

    first, first_expected, first_tensors = step()  # kept alive: the second's are elsewhere
    second, second_expected, _ = step()
    assert len(plans) == 1
    assert all(first[name] != second[name] for name in ("q", "k", "v", "cache_seqlens"))
    for got, expected in ((first, first_expected), (second, second_expected)):
        assert {name: got[name] for name in expected} == expected
        assert got["num_splits"] == 3
        rows = 2 * 8 * 1
        assert got["lse_accum"] - got["o_accum"] == 4 * got["num_splits"] * rows * 64
    allocated = {"o", "softmax_lse", "o_accum", "lse_accum"}
    addresses = set(second_expected) | allocated
    assert ({k: v for k, v in first.items() if k not in addresses}
            == {k: v for k, v in second.items() if k not in addresses})


def test_a_prepared_launch_sets_its_addresses_and_keeps_every_other_field(built_binding):
    """prepare_decode fills DecodeParams once; each call sets the patched pointer members (in the
    order given) and launches on the stream it ends with."""
    members = [name for name, _ in DecodeParams._fields_]
    kinds = dict(DecodeParams._fields_)
    values = [8 * (i + 1) if kinds[name] is ctypes.c_void_p
              else float(i) if kinds[name] is ctypes.c_float else i
              for i, name in enumerate(members)]
    launcher = RecordingLauncher(DecodeParams)
    prepared = built_binding.prepare_decode(launcher.address, launcher.error_string_address,
                                            [members.index("o"), members.index("q")], *values)
    for o, q in ((4096, 8192), (12288, 16384)):
        prepared(o, q, 77)
    (first, stream), (second, _) = launcher.launches
    assert stream == 77
    assert (first.o, first.q, second.o, second.q) == (4096, 8192, 12288, 16384)
    unpatched = {name: value for name, value in zip(members, values) if name not in ("o", "q")}
    for launched in (first, second):
        assert {name: fields(launched)[name] for name in unpatched} == unpatched


def test_a_prepared_launch_refuses_what_it_cannot_set(built_binding):
    members = [name for name, _ in DecodeParams._fields_]
    launcher = RecordingLauncher(DecodeParams)
    values = [0] * len(members)
    with pytest.raises(ValueError, match="no pointer member"):
        built_binding.prepare_decode(launcher.address, launcher.error_string_address,
                                     [members.index("batch")], *values)
    prepared = built_binding.prepare_decode(launcher.address, launcher.error_string_address,
                                            [members.index("q")], *values)
    with pytest.raises(ValueError, match="takes its 1 patched addresses, then the stream; got 1"):
        prepared(77)
    assert launcher.launches == []
