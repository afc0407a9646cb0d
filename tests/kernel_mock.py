"""flashgen's real Python call path on a CPU: tensors that report cuda:0, allocations sent to the
CPU, fixed kernel choices (the mma family's sm_80 bf16 hd64 main tiles) and a binding whose
launches record their arguments and write nothing. For tests that follow a call down to the
kernels' params (test_op_schema_cpu.py) or check what a call returns unwritten
(test_poison_cpu.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch

from codegen import paths
from codegen.config import load_config
from codegen.spec import enumerate_specs
from flashgen import attention, backward, decode, forward, host, kvcache, loader
from tests.poison import ALLOCATORS


def launcher(kind: str, mask: str) -> loader.Launcher:
    """The mma family's sm_80 bf16 hd64 main-tile kernel of that kind and mask, at address 0."""
    (spec,) = enumerate_specs(load_config(paths.DEFAULT_CONFIG), archs=["sm_80"], head_dims=[64],
                              dtypes=["bf16"], masks=[mask], kinds=[kind], family_names=["mma"],
                              alt_tiles=False, score_mods=["none"], dropout=False)
    return loader.Launcher(spec, 0, 0, None)


def _on_the_cpu(allocate):
    def allocating(*args, **kwargs):
        if "device" in kwargs:  # the tensors report cuda:0
            kwargs["device"] = "cpu"
        return allocate(*args, **kwargs)
    return allocating


def _recording(calls: list, real, result):
    """A stand-in for real that records the arguments it gets, by name, and returns result."""
    signature = inspect.signature(real)

    def record(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append(dict(bound.arguments))
        return result(bound.arguments)
    record.__signature__ = signature  # for callers that read it (transformers does)
    record.cache_clear = lambda: None  # real's caches, which the stand-in replaces
    return record


def install(monkeypatch) -> SimpleNamespace:
    """Installs the mock; returns what it records: launches, [(binding entry, its arguments but
    the stream)], and the kernel choices' arguments by name, fwd_plans, bwd_choices and
    decode_plans. Install a poison after it, so that it wraps the CPU allocators."""
    cuda0 = torch.device("cuda", 0)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: cuda0))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: 0)
    for owner, name in (*ALLOCATORS, (torch, "zeros"), (torch, "arange")):
        monkeypatch.setattr(owner, name, _on_the_cpu(getattr(owner, name)))

    record = SimpleNamespace(launches=[], fwd_plans=[], bwd_choices=[], decode_plans=[])
    def preparer(entry: str):
        def prepare(address, error_string, patched, *fields):
            def launch(*addresses_and_stream):
                filled = list(fields)
                for index, address_ in zip(patched, addresses_and_stream[:-1]):
                    filled[index] = address_
                record.launches.append((entry, (address, error_string, *filled)))
            # Prepared.parts(): the fields stand in for the params' bytes, their indices for
            # the patched members' byte offsets.
            launch.parts = lambda: (address, error_string, tuple(fields), tuple(patched))
            return launch
        return prepare

    binding = SimpleNamespace(**{f"prepare_{entry}": preparer(entry)
                                 for entry in ("decode", "fwd", "bwd")}, **{
        entry: (lambda *args, entry=entry: record.launches.append((entry, args[:-1])))
        for entry in ("fwd", "bwd", "decode", "attention")})
    monkeypatch.setattr(loader, "binding", lambda: binding)
    # Launches kept from the binding before (none of this one's) and the streams' buffers
    for owner, name in ((forward, "_kept"), (backward, "_kept"), (attention, "_known"),
                        (decode, "_plans"), (kvcache, "_known"), (decode, "_scratch"),
                        (decode, "_split_counters")):
        monkeypatch.setattr(owner, name, {})
    monkeypatch.setattr(host, "_current_stream", lambda index: 0)
    monkeypatch.setattr(host, "_current_device", lambda: 0)
    monkeypatch.setattr(host, "stream_capturing", lambda: False)
    monkeypatch.setattr(host, "device_resources", lambda index: (108, 40 << 20))  # an A100's
    fwd = {mask: launcher("fwd", mask) for mask in ("none", "causal")}
    bwd = {mask: launcher("bwd", mask) for mask in ("none", "causal")}
    decode_launcher = launcher("kvcache", "none")
    # Variants' masks run on the plain kernels: the launches only record.
    monkeypatch.setattr(forward, "_plan", _recording(
        record.fwd_plans, forward._plan,
        lambda a: (fwd.get(a["mask"], fwd["none"]), None, {"ranks_per_round": 1}, False)))
    monkeypatch.setattr(backward, "_choose", _recording(
        record.bwd_choices, backward._choose, lambda a: (bwd.get(a["mask"], bwd["none"]), None)))
    monkeypatch.setattr(decode, "_plan", _recording(
        record.decode_plans, decode._plan, lambda a: (decode_launcher, 216)))
    monkeypatch.setattr(decode, "_padded_head_dim", lambda *_: None)  # its own kernels
    return record
