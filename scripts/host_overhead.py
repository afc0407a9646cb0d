"""Where the host time of a tiny flashgen call goes. The requirement: a tiny call (batch 1, 1 head,
seqlen 64, head dim 64, bf16, no grad) no slower from Python than the same call through PyTorch's
SDPA FLASH_ATTENTION backend.

Prints microseconds per call (median of rounds of many calls): the whole calls, then the tree of
flashgen functions that one call runs, each timed alone by replaying the arguments it got in that
call (`total` includes its callees; `self` is total minus the callees' totals: the function's own
code, a difference of medians that noise can push below zero).

On a CUDA machine, the real path (the hd64 bf16 kernel is compiled on first use if not built):
    PYTHONPATH=$PWD python3 scripts/host_overhead.py
On a machine without CUDA, the same functions with the CUDA parts replaced: tensors on the CPU
that report cuda:0, a fixed kernel choice, stream 0, device 0, and the real binding calling an
empty launcher compiled here with the host compiler. Python costs only; torch's SDPA is not timed:
    PYTHONPATH=$PWD python3 scripts/host_overhead.py --cpu-mock

With --training, a tiny training call instead (the same shape, causal, q, k and v requiring grad):
the forward with autograd and the backward, and the forward with autograd alone (on CUDA beside
SDPA's FLASH_ATTENTION; the mock's backward stands for the hopper family's hd64 causal kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from codegen import params, paths
from codegen.config import load_config
from codegen.spec import enumerate_specs
from flashgen import backward, forward, interface, launch, loader, ops, validate

SHAPE = (1, 64, 1, 64)  # (batch, seqlen, heads, head_dim)
# The functions of the eager path, as (module, name); those a call does not reach are left out.
PATH = ([(interface, name) for name in ("flash_attn_func", "scaled_dot_product_attention",
                                        "_autocast", "_check_sdpa_tensors")]
        + [(validate, name) for name in ("check_unsupported", "passes_tensor_checks",
                                         "check_tensors", "check_shapes", "check_scale")]
        + [(ops, name) for name in ("attention", "_runs_plain_eager", "_fwd_cuda")]
        + [(forward, name) for name in ("forward", "_plan", "empty_outputs", "run")]
        + [(launch, name) for name in ("empty_output", "aligned", "is_aligned", "call_on_device",
                                       "_current_stream", "_current_device")]
        + [(params, "fwd_args")])
# What --cpu-mock replaces by a constant: their CPU time says nothing.
MOCKED = {"_plan", "_current_stream", "_current_device"}


@dataclass
class Call:
    """One function call of a recorded path, with the calls it made."""
    name: str
    function: object
    args: tuple
    kwargs: dict
    children: list["Call"] = field(default_factory=list)


def per_call_us(fn, calls: int, rounds: int, synchronize) -> float:
    """Median over rounds of the mean time per call; synchronized between rounds only, so queued
    kernels overlap the host work as they do in a model. A round of fewer calls than CUDA queues
    launches (about 1000) never blocks on a full queue: the time stays the host's even for a
    replayed launch that takes less time than its kernel."""
    for _ in range(max(calls // 10, 10)):
        fn()
    times = []
    for _ in range(rounds):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    synchronize()
    return statistics.median(times)


def record(call) -> Call:
    """The tree of PATH functions (and the binding's fwd) that call() runs, with their arguments."""
    root = Call("", None, (), {})
    stack = [root]

    def recording(name, function):
        def wrapper(*args, **kwargs):
            node = Call(name, function, args, kwargs)
            stack[-1].children.append(node)
            stack.append(node)
            try:
                return function(*args, **kwargs)
            finally:
                stack.pop()
        return wrapper

    binding = loader.binding()

    class RecordingBinding:
        fwd = staticmethod(recording("binding fwd", binding.fwd))

    saved = [(module, name, getattr(module, name)) for module, name in PATH
             if hasattr(module, name)] + [(loader, "binding", loader.binding)]
    for module, name, function in saved[:-1]:
        setattr(module, name, recording(name, function))
    loader.binding = lambda: RecordingBinding
    try:
        call()
    finally:
        for module, name, function in saved:
            setattr(module, name, function)
    return root


def grouped(calls: list[Call]) -> list[list[Call]]:
    """Calls in order, repeated calls of one function in a row together (is_aligned x3)."""
    groups: list[list[Call]] = []
    for call in calls:
        if groups and groups[-1][0].name == call.name:
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups


def replay(calls: list[Call]):
    def run():
        for c in calls:
            c.function(*c.args, **c.kwargs)
    return run


def timed_rows(node: Call, depth: int, time_replay) -> tuple[list[tuple], float]:
    """(depth, label, total, self) for the calls under node, parents before their callees, and
    the sum of the totals at this depth."""
    rows, depth_total = [], 0.0
    for group in grouped(node.children):
        total = time_replay(group)
        below, below_total = (timed_rows(group[0], depth + 1, time_replay) if len(group) == 1
                              else ([], 0.0))
        label = group[0].name + (f" x{len(group)}" if len(group) > 1 else "")
        rows += [(depth, label, total, total - below_total)] + below
        depth_total += total
    return rows, depth_total


def path_report(call, calls: int, rounds: int, synchronize, cpu: bool) -> list[str]:
    rows, _ = timed_rows(record(call), 0,
                         lambda group: per_call_us(replay(group), calls, rounds, synchronize))
    lines = ["   total     self"]
    for depth, label, total, self_us in rows:
        mocked = "  (mocked)" if cpu and label in MOCKED else ""
        lines.append(f"  {total:6.2f}  {self_us:6.2f}  {'  ' * depth}{label}{mocked}")
    return lines


def totals(q, k, v, with_torch: bool) -> list[tuple]:
    """(name, function, context) of whole calls: flashgen's two functions and, on CUDA, PyTorch's
    SDPA on the same data."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    query, key, value = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (b, h, s, d)
    result = [("flashgen flash_attn_func (b, s, h, d)", lambda: interface.flash_attn_func(q, k, v),
               contextlib.nullcontext()),
              ("flashgen scaled_dot_product_attention (b, h, s, d)",
               lambda: interface.scaled_dot_product_attention(query, key, value),
               contextlib.nullcontext())]
    if with_torch:
        flash = SDPBackend.FLASH_ATTENTION
        result += [("torch SDPA FLASH_ATTENTION (b, h, s, d)",
                    lambda: F.scaled_dot_product_attention(query, key, value), sdpa_kernel(flash)),
                   ("torch SDPA FLASH_ATTENTION from (b, s, h, d), 3 transposes "
                    "(as bench --overhead)",
                    lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                           v.transpose(1, 2)),
                    sdpa_kernel(flash))]
    return result


@contextlib.contextmanager
def cpu_mock():
    """CPU tensors that report cuda:0 to Python (a property instead of a C getter: about the same
    cost), allocations on the CPU, a fixed kernel choice, stream 0 and device 0, and the binding
    calling an empty launcher."""
    cuda0, cpu = torch.device("cuda", 0), torch.device("cpu")
    real_empty, real_empty_permuted = torch.empty, torch.empty_permuted
    # The mma family's main hd64 forward and the hopper family's hd64 causal backward, on sm_90.
    launcher = empty_launcher("fwd", "mma", "none")
    backward_launcher = empty_launcher("bwd", "hopper", "causal")
    patches = [(torch.Tensor, "device", property(lambda t: cuda0)),
               (torch.Tensor, "is_cuda", property(lambda t: True)),
               (torch.Tensor, "get_device", lambda t: 0),
               (torch, "empty", lambda *a, device=None, **kw: real_empty(*a, device=cpu, **kw)),
               (torch, "empty_permuted",
                lambda *a, device=None, **kw: real_empty_permuted(*a, device=cpu, **kw)),
               (torch.cuda, "synchronize", lambda: None),
               (launch, "_current_stream", lambda index: 0),
               (launch, "_current_device", lambda: 0),
               # the mma family's plan: no padding, its grid field, inputs not loaded by TMA
               (forward, "_plan", lambda *args: (launcher, None, {"ranks_per_round": 1}, False)),
               (backward, "_choose", lambda *args: (backward_launcher, None)),
               (launch, "device_resources", lambda index: (132, 50 << 20))]  # an H100's
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def empty_launcher(kind: str, family: str, mask: str) -> loader.Launcher:
    """A launcher that returns success at once, built with the host compiler, standing for the
    bf16 hd64 sm_90 main-tile kernel of that kind, family and mask."""
    folder = Path(tempfile.mkdtemp(prefix="flashgen-empty-launcher-"))
    source = folder / "empty.cpp"
    source.write_text('extern "C" int empty_launcher(const void*, void*) { return 0; }\n'
                      'extern "C" const char* empty_error_string(int) { return ""; }\n')
    library_path = folder / "empty.so"
    subprocess.run([os.environ.get("CXX", "c++"), "-O2", "-shared", "-fPIC", str(source), "-o",
                    str(library_path)], check=True)
    library = ctypes.CDLL(str(library_path))
    address = ctypes.cast(library.empty_launcher, ctypes.c_void_p).value
    error_string = ctypes.cast(library.empty_error_string, ctypes.c_void_p).value
    (spec,) = enumerate_specs(load_config(paths.DEFAULT_CONFIG), archs=["sm_90"], head_dims=[64],
                              dtypes=["bf16"], masks=[mask], kinds=[kind],
                              family_names=[family], alt_tiles=False, score_mods=["none"],
                              dropout=False)
    return loader.Launcher(spec, address, error_string, library)


def report(cpu: bool, calls: int, rounds: int) -> None:
    q, k, v = (torch.randn(SHAPE, dtype=torch.bfloat16, device="cpu" if cpu else "cuda")
               for _ in range(3))
    query, key, value = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    synchronize = torch.cuda.synchronize
    where = ("CPU mock (Python costs; CUDA replaced)" if cpu
             else f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"flashgen host overhead: bf16 q, k, v {SHAPE}, no grad; {where}")
    print(f"median of {rounds} rounds x {calls} calls, microseconds per call\n")

    with torch.no_grad():
        # A first run of the CPU at full clock: the first rows read high without it.
        per_call_us(lambda: interface.flash_attn_func(q, k, v), 20000, 1, synchronize)
        total_rows = []
        for name, fn, context in totals(q, k, v, with_torch=not cpu):
            with context:
                total_rows.append((name, per_call_us(fn, calls, rounds, synchronize)))
        for name, us in total_rows:
            print(f"  {us:7.2f}  {name}")
        if not cpu:
            ours, theirs = total_rows[0][1], total_rows[2][1]
            print(f"  ratio flash_attn_func / torch SDPA FLASH_ATTENTION: {ours / theirs:.2f}x "
                  f"(target <= 1.0x)")
        paths = (("flash_attn_func(q, k, v)", lambda: interface.flash_attn_func(q, k, v)),
                 ("scaled_dot_product_attention(query, key, value)",
                  lambda: interface.scaled_dot_product_attention(query, key, value)))
        for title, call in paths:
            print(f"\n{title}, each function timed alone:")
            print("\n".join(path_report(call, calls, rounds, synchronize, cpu)))
        floor = per_call_us(lambda: None, calls, rounds, synchronize)
        print(f"\n(an empty call in the timing loop: {floor:.2f})")


def training_report(cpu: bool, calls: int, rounds: int) -> None:
    """Host time of a tiny training call. Rounds of `calls` calls (each a handful of launches)
    stay below the queue's depth, so on CUDA the times are the host's too."""
    device = "cpu" if cpu else "cuda"
    q, k, v = (torch.randn(SHAPE, dtype=torch.bfloat16, device=device).requires_grad_()
               for _ in range(3))
    dout = torch.randn(SHAPE, dtype=torch.bfloat16, device=device)
    query, key, value = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    where = ("CPU mock (Python costs; CUDA replaced)" if cpu
             else f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"flashgen host time of a training call: bf16 q, k, v {SHAPE}, causal; {where}")
    print(f"median of {rounds} rounds x {calls} calls, microseconds per call\n")

    def training(attention, inputs):
        def call():
            attention(*inputs).backward(dout if inputs[0] is q else dout.transpose(1, 2))
            for t in inputs:
                t.grad = None
        return call

    def ours(*t):
        return interface.flash_attn_func(*t, causal=True)

    rows = [("flashgen flash_attn_func, forward + backward", training(ours, (q, k, v)),
             contextlib.nullcontext()),
            ("flashgen flash_attn_func, forward with autograd", lambda: ours(q, k, v),
             contextlib.nullcontext())]
    if not cpu:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def theirs(*t):
            return F.scaled_dot_product_attention(*t, is_causal=True)

        flash = SDPBackend.FLASH_ATTENTION
        rows += [("torch SDPA FLASH_ATTENTION, forward + backward",
                  training(theirs, (query, key, value)), sdpa_kernel(flash)),
                 ("torch SDPA FLASH_ATTENTION, forward with autograd",
                  lambda: theirs(query, key, value), sdpa_kernel(flash))]
    for name, fn, context in rows:
        with context:
            print(f"  {per_call_us(fn, calls, rounds, torch.cuda.synchronize):7.2f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-mock", action="store_true",
                        help="no CUDA: time the Python path with CUDA replaced")
    parser.add_argument("--training", action="store_true",
                        help="a training call (forward with autograd, backward) instead")
    parser.add_argument("--calls", type=int, help="calls per round (500; 100 with --training)")
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    calls = args.calls or (100 if args.training else 500)
    with cpu_mock() if args.cpu_mock else contextlib.nullcontext():
        if args.training:
            training_report(cpu=args.cpu_mock, calls=calls, rounds=args.rounds)
        else:
            report(cpu=args.cpu_mock, calls=calls, rounds=args.rounds)


if __name__ == "__main__":
    main()
