"""The pybind11 binding on a CPU: what forward.launch and backward.launch pass reaches the launcher
in the right FwdParams / BwdParams fields. The launcher is a Python function behind a C function
pointer that copies the params it gets; the binding is built with the host compiler (seconds)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pybind11")
if shutil.which(os.environ.get("CXX", "c++")) is None:
    pytest.skip("no host C++ compiler to build the binding", allow_module_level=True)

from codegen import build  # noqa: E402
from flashgen import backward, forward, loader  # noqa: E402

STRIDE_NAMES = ("batch", "row", "head")


def stride_fields(*tensors):
    return [(f"{t}_{s}_stride", ctypes.c_int64) for t in tensors for s in STRIDE_NAMES]


SIZE_FIELDS = [(name, ctypes.c_int) for name in ("batch", "heads", "heads_kv", "seqlen_q",
                                                  "seqlen_k")]
SCALE_FIELDS = [("softmax_scale", ctypes.c_float), ("scale_log2", ctypes.c_float),
                ("causal_offset", ctypes.c_int)]


class FwdParams(ctypes.Structure):
    """templates/include/flashgen/params.h's FwdParams, field by field."""
    _fields_ = ([(name, ctypes.c_void_p) for name in ("q", "k", "v", "o", "softmax_lse")]
                + stride_fields("q", "k", "v", "o") + SIZE_FIELDS + SCALE_FIELDS)


class BwdParams(ctypes.Structure):
    """params.h's BwdParams, field by field."""
    _fields_ = ([(name, ctypes.c_void_p) for name in ("q", "k", "v", "o", "dout", "softmax_lse",
                                                       "dq", "dk", "dv", "softmax_d", "dq_accum")]
                + stride_fields("q", "k", "v", "o", "do", "dq", "dk", "dv") + SIZE_FIELDS
                + SCALE_FIELDS)


@pytest.fixture(scope="module")
def built_binding(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        path = build.build_binding(log=lambda message: None)
    spec = importlib.util.spec_from_file_location("_flashgen_binding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingLauncher:
    """A loader.Launcher stand-in whose address calls back into Python: keeps a copy of the params
    and the stream of each launch, and returns `error` (0: success)."""

    def __init__(self, params_type, error: int = 0):
        self.launches = []

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
    monkeypatch.setattr(forward, "_current_stream", lambda device_index: 77)
    monkeypatch.setattr(forward, "_current_device", lambda: -1)  # a CPU tensor's get_device()


def distinct_strides(batch, seq, heads, dim):
    """A (batch, seq, heads, dim) view with every stride different, head dim contiguous."""
    return torch.randn(batch, heads + 1, seq + 2, dim, dtype=torch.bfloat16)[:, :heads, :seq]\
        .transpose(1, 2)


def assert_tensor_fields(params, prefix, t, pointer_name=None):
    assert getattr(params, pointer_name or prefix) == t.data_ptr()
    assert [getattr(params, f"{prefix}_{s}_stride") for s in STRIDE_NAMES] == list(t.stride()[:3])


def test_forward_launch_fills_every_field(binding):
    q, k, v = (distinct_strides(2, 5, 4, 64), distinct_strides(2, 7, 2, 64),
               distinct_strides(2, 7, 2, 64))
    o = torch.empty(2, 5, 4, 64, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 5)
    launcher = RecordingLauncher(FwdParams)
    forward.launch(launcher, q, k, v, o, lse, 0.125, 2)
    ((params, stream),) = launcher.launches
    assert stream == 77
    for name, t in zip("qkvo", (q, k, v, o)):
        assert_tensor_fields(params, name, t)
    assert params.softmax_lse == lse.data_ptr()
    assert (params.batch, params.heads, params.heads_kv, params.seqlen_q, params.seqlen_k) == (
        2, 4, 2, 5, 7)
    assert params.softmax_scale == 0.125 and params.causal_offset == 2
    assert params.scale_log2 == pytest.approx(0.125 * math.log2(math.e))


def test_forward_launch_failure_raises_with_the_error_string(binding):
    q = distinct_strides(1, 4, 1, 64)
    launcher = RecordingLauncher(FwdParams, error=2)
    with pytest.raises(RuntimeError, match=f"kernel launch failed: {os.strerror(2)}"):
        forward.launch(launcher, q, q, q, torch.empty_like(q), torch.empty(1, 1, 4), 0.125, 0)


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_launch_fills_every_field(binding, monkeypatch, deterministic):
    class Stream:
        cuda_stream = 78

    monkeypatch.setattr(backward.torch.cuda, "current_stream", lambda device: Stream)
    monkeypatch.setattr(backward.torch.cuda, "device", lambda device: contextlib.nullcontext())
    shapes = {"q": (2, 5, 4, 64), "k": (2, 7, 2, 64), "v": (2, 7, 2, 64), "o": (2, 5, 4, 64),
              "do": (2, 5, 4, 64), "dq": (2, 5, 4, 64), "dk": (2, 7, 2, 64), "dv": (2, 7, 2, 64)}
    tensors = {name: distinct_strides(*shape) for name, shape in shapes.items()}
    lse = torch.empty(2, 4, 5)
    launcher = RecordingLauncher(BwdParams)
    backward.launch(launcher, tensors["q"], tensors["k"], tensors["v"], tensors["o"],
                    tensors["do"], lse, tensors["dq"], tensors["dk"], tensors["dv"], 0.125, 2,
                    deterministic)
    ((params, stream),) = launcher.launches
    assert stream == 78
    for name, t in tensors.items():
        assert_tensor_fields(params, name, t, pointer_name="dout" if name == "do" else None)
    assert params.softmax_lse == lse.data_ptr() and params.softmax_d is not None
    assert (params.dq_accum is None) == deterministic  # ctypes reads a null pointer as None
    assert (params.batch, params.heads, params.heads_kv, params.seqlen_q, params.seqlen_k) == (
        2, 4, 2, 5, 7)
    assert params.softmax_scale == 0.125 and params.causal_offset == 2
    assert params.scale_log2 == pytest.approx(0.125 * math.log2(math.e))
