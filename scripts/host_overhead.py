"""Where the host time of a tiny flashgen call goes: the requirement is a tiny call (batch 1,
1 head, seqlen 64, head dim 64, bf16) no slower from Python than the same call through PyTorch's
SDPA FLASH_ATTENTION backend. Prints per-call microseconds (median of rounds of many calls): the
totals, then each stage of the eager path timed alone, then the nested calls of that path (each
includes the ones below it).

On a CUDA machine, the real path (the hd64 bf16 kernel is compiled on first use if not built):
    PYTHONPATH=$PWD python3 scripts/host_overhead.py
On a machine without CUDA, the same stages with the CUDA parts replaced (tensors on the CPU that
report cuda:0, a fixed kernel choice, stream 0, and the real binding calling an empty launcher,
compiled here with the host compiler). A measure of Python costs only; torch's own SDPA is not
timed there:
    PYTHONPATH=$PWD python3 scripts/host_overhead.py --cpu-mock
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from flashgen import forward, interface, loader, ops, validate

SHAPE = (1, 64, 1, 64)  # (batch, seqlen, heads, head_dim)
# Stages that --cpu-mock replaces by a constant: their CPU time says nothing.
MOCKED = {"_choose", "launch: current stream", "launch: current device"}


def per_call_us(fn, calls: int, rounds: int, synchronize) -> float:
    """Median over rounds of the mean time per call; synchronized between rounds only, so queued
    kernels overlap the host work as they do in a model."""
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


def recorded_binding_arguments(call) -> tuple:
    """The arguments that `call` passes to the binding's fwd (the binding is not called)."""
    recorded = []

    class Recorder:
        @staticmethod
        def fwd(*args):
            recorded.append(args)

    real = loader.binding
    loader.binding = lambda: Recorder
    try:
        call()
    finally:
        loader.binding = real
    return recorded[-1]


def flash_attn_func_stages(q, k, v) -> list[tuple[str, object]]:
    """Each stage of flash_attn_func's eager path, called as the path calls it."""
    launcher, _ = forward._choose(q.device, "bf16", q.shape[-1], False)
    out, lse = forward.empty_outputs(q, False)
    scale = validate.check_scale(None, q.shape[-1])
    binding = loader.binding()
    fwd_arguments = recorded_binding_arguments(
        lambda: forward.launch(launcher, q, k, v, out, lse, scale, 0))
    return [
        ("_autocast", lambda: interface._autocast(q, k, v)),
        ("passes_tensor_checks", lambda: validate.passes_tensor_checks(q, k, v, heads_axis=2)),
        ("check_scale", lambda: validate.check_scale(None, q.shape[-1])),
        ("_runs_plain_eager", lambda: ops._runs_plain_eager((q, k, v))),
        ("_choose", lambda: forward._choose(q.device, "bf16", q.shape[-1], False)),
        ("empty_outputs", lambda: forward.empty_outputs(q, False)),
        ("is_aligned x3", lambda: (validate.is_aligned(q), validate.is_aligned(k),
                                   validate.is_aligned(v))),
        ("launch: current stream", lambda: forward._current_stream(q.device.index)),
        ("launch: current device", lambda: torch.cuda.current_device()),
        ("launch: binding fwd", lambda: binding.fwd(*fwd_arguments)),
    ]


def nested_calls(q, k, v) -> list[tuple[str, object]]:
    """flash_attn_func and the calls it makes, outermost first."""
    launcher, _ = forward._choose(q.device, "bf16", q.shape[-1], False)
    out, lse = forward.empty_outputs(q, False)
    scale = validate.check_scale(None, q.shape[-1])
    return [
        ("flash_attn_func", lambda: interface.flash_attn_func(q, k, v)),
        ("ops.attention", lambda: ops.attention(q, k, v, scale, False, 0, False, False)),
        ("forward.forward", lambda: forward.forward(q, k, v, "bf16", scale, False, 0, False)),
        ("forward.launch", lambda: forward.launch(launcher, q, k, v, out, lse, scale, 0)),
    ]


def totals(q, k, v, with_torch: bool) -> list[tuple]:
    """(name, function, context) of whole calls: flashgen's two functions and, on CUDA, PyTorch's
    SDPA on the same data."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    query, key, value = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (b, h, s, d)
    rows = [("flashgen flash_attn_func (b, s, h, d)", lambda: interface.flash_attn_func(q, k, v),
             contextlib.nullcontext()),
            ("flashgen scaled_dot_product_attention (b, h, s, d)",
             lambda: interface.scaled_dot_product_attention(query, key, value),
             contextlib.nullcontext())]
    if with_torch:
        flash = SDPBackend.FLASH_ATTENTION
        rows += [("torch SDPA FLASH_ATTENTION (b, h, s, d)",
                  lambda: F.scaled_dot_product_attention(query, key, value), sdpa_kernel(flash)),
                 ("torch SDPA FLASH_ATTENTION from (b, s, h, d), 3 transposes (bench --overhead)",
                  lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                         v.transpose(1, 2)), sdpa_kernel(flash))]
    return rows


@contextlib.contextmanager
def cpu_mock():
    """CPU tensors that report cuda:0 to Python (a property instead of a C getter: about the same
    cost), allocations on the CPU, a fixed kernel choice, stream 0 and device 0, and the binding
    calling an empty launcher."""
    cuda0, cpu = torch.device("cuda", 0), torch.device("cpu")
    real_empty, real_empty_permuted = torch.empty, torch.empty_permuted
    launcher = empty_launcher()
    patches = [(torch.Tensor, "device", property(lambda t: cuda0)),
               (torch.Tensor, "is_cuda", property(lambda t: True)),
               (torch.Tensor, "get_device", lambda t: 0),
               (torch, "empty", lambda *a, device=None, **kw: real_empty(*a, device=cpu, **kw)),
               (torch, "empty_permuted",
                lambda *a, device=None, **kw: real_empty_permuted(*a, device=cpu, **kw)),
               (torch.cuda, "current_device", lambda: 0),
               (torch.cuda, "synchronize", lambda: None),
               (forward, "_current_stream", lambda index: 0),
               (forward, "_choose", lambda *args: (launcher, None))]
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


def empty_launcher() -> loader.Launcher:
    """A launcher that returns success at once, built with the host compiler."""
    folder = Path(tempfile.mkdtemp(prefix="flashgen-empty-launcher-"))
    source = folder / "empty.cpp"
    source.write_text('extern "C" int empty_launcher(const void*, void*) { return 0; }\n'
                      'extern "C" const char* empty_error_string(int) { return ""; }\n')
    library_path = folder / "empty.so"
    subprocess.run(["c++", "-O2", "-shared", "-fPIC", str(source), "-o", str(library_path)],
                   check=True)
    library = ctypes.CDLL(str(library_path))
    address = ctypes.cast(library.empty_launcher, ctypes.c_void_p).value
    error_string = ctypes.cast(library.empty_error_string, ctypes.c_void_p).value
    return loader.Launcher(None, address, error_string, library)


def report(cpu: bool, calls: int, rounds: int) -> None:
    device = "cpu" if cpu else "cuda"
    q, k, v = (torch.randn(SHAPE, dtype=torch.bfloat16, device=device) for _ in range(3))
    synchronize = torch.cuda.synchronize
    where = ("CPU mock (Python costs; CUDA replaced)" if cpu
             else f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"flashgen host overhead: bf16 q, k, v {SHAPE}, no grad; {where}")
    print(f"median of {rounds} rounds x {calls} calls, microseconds per call\n")

    def time_rows(rows):
        results = []
        for name, fn, *context in rows:
            with context[0] if context else contextlib.nullcontext():
                results.append((name, per_call_us(fn, calls, rounds, synchronize)))
        return results

    with torch.no_grad():
        # A first run of the CPU at full clock: the first rows read high without it.
        per_call_us(lambda: interface.flash_attn_func(q, k, v), calls * 10, 1, synchronize)
        total_rows = time_rows(totals(q, k, v, with_torch=not cpu))
        stage_rows = time_rows(flash_attn_func_stages(q, k, v))
        nested_rows = time_rows(nested_calls(q, k, v))
        floor = per_call_us(lambda: None, calls, rounds, synchronize)

    for name, us in total_rows:
        print(f"  {us:7.2f}  {name}")
    if not cpu:
        ours, theirs = total_rows[0][1], total_rows[2][1]
        print(f"  ratio flash_attn_func / torch SDPA FLASH_ATTENTION: {ours / theirs:.2f}x "
              f"(target <= 1.0x)")
    print("\nstages of flash_attn_func, each timed alone:")
    for name, us in stage_rows:
        print(f"  {us:7.2f}  {name}{'  (mocked)' if cpu and name in MOCKED else ''}")
    print(f"  {sum(us for _, us in stage_rows):7.2f}  sum (includes one loop floor of "
          f"{floor:.2f} per stage)")
    print("\nnested calls (each includes those below it):")
    for name, us in nested_rows:
        print(f"  {us:7.2f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-mock", action="store_true",
                        help="no CUDA: time the Python stages with CUDA replaced")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.cpu_mock:
        with cpu_mock():
            report(cpu=True, calls=args.calls, rounds=args.rounds)
    else:
        report(cpu=False, calls=args.calls, rounds=args.rounds)


if __name__ == "__main__":
    main()
