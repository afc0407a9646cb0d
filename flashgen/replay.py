"""The compiled replay of known calls: templates/replay.cpp, built against this torch, matches a
call's arguments to what decode (flash_attn_with_kvcache), forward (flash_attn_func and
flash_attn_varlen_func where no input requires grad) or backward (flash_attn_func's dense
backward) planned for an earlier call of the same signature and launches it with no Python
between the call and the launch (the host time of a decode step is what eager serving pays on
every layer of every token; a small training step's, on every layer twice).

Optional. Where it is not built yet the same plans run from Python while it builds in the
background (once per Python and torch version; `flashgen generate` builds it too);
FLASHGEN_JIT=0 builds nothing at call time, FLASHGEN_REPLAY=0 turns it off, and a failed build
says so once and leaves the Python path. The backward's replay is off unless
FLASHGEN_REPLAY_BACKWARD=1, until the GPU suite has run it (tests/gpu/test_replay.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading

from codegen import paths
from flashgen import cache


def _off(*arguments):
    return None


def _first_decode(lse_wanted, *arguments):
    _start()
    return decode(lse_wanted, *arguments)


def _first_forward(result, *arguments):
    _start()
    return forward(result, *arguments)


def _first_backward(*arguments):
    _start()
    return backward(*arguments)


# decode(lse_wanted, *flash_attn_with_kvcache's arguments in kvcache.given's order): out, or
# (out, lse) where lse_wanted, for a call that matches a kept plan; None for any other.
decode = _first_decode
# forward(result, *flash_attn_func's or flash_attn_varlen_func's arguments in attention.py's
# given order): out where result is 0, (out, lse, None) where 1, (out, lse) where 2, for a call
# that matches a kept launch; None for any other (and under autocast).
forward = _first_forward
# backward(*arguments): (dq, dk, dv) for ops._fwd_backward's arguments (the backward's gradient,
# then what fwd's autograd saved: op_schema.SAVED.replayed) where they match a kept launch and
# grad mode is off; None for any other.
backward = _first_backward
_module = None
_lock = threading.Lock()
# Counts forget()s: a plan offered to keep_decode in an earlier generation is no longer kept.
generation = 0


def _start() -> None:
    """The first call in a process (or after reset): loads the module, or starts its build;
    until it loads, calls run from Python."""
    global decode, forward, backward
    decode = forward = backward = _off
    if os.environ.get("FLASHGEN_REPLAY") == "0":
        return
    import torch

    if torch.version.cuda is None:
        return
    try:
        path = cache.replay_path()
    except OSError:
        return
    if path.is_file():
        _load(path)
    elif paths.jit_enabled():
        threading.Thread(target=_build_then_load, daemon=True).start()


def _build_then_load() -> None:
    from codegen import build

    try:
        path = build.build_replay(log=lambda message: None)
    except Exception as error:  # noqa: BLE001 - the Python path keeps serving the calls
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        print(f"flashgen: the replay of known calls did not build ({first_line}); "
              f"repeated calls run from Python", file=sys.stderr)
        return
    _load(path)


def _load(path) -> None:
    global _module, decode, forward, backward
    with _lock:
        if _module is None:
            spec = importlib.util.spec_from_file_location("_flashgen_replay", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _module = module
        decode, forward = _module.decode, _module.forward
        backward = (_module.backward if os.environ.get("FLASHGEN_REPLAY_BACKWARD") == "1"
                    else _off)


def ready() -> bool:
    """Whether calls are matched and replayed from C++ now."""
    return _module is not None and decode is _module.decode


def keep_decode(given: tuple, parts: tuple, source_positions: dict) -> bool:
    """Keeps decode's plan (decode.replay_parts' parts) for calls of given's signature, each of
    its input sources read from the argument at source_positions[source]; False where the
    module is not loaded, an argument is of a kind its match does not compare, or it keeps as
    many signatures as it takes."""
    if not ready():
        return False
    inputs, roles, launches, workspace, lse_rows, counters, rotary = parts
    pairs = [value for source in inputs for value in (source, source_positions[source])]
    return _module.keep_decode(given, pairs, launches, roles, workspace, lse_rows, counters,
                               rotary, source_positions[0])


def keep_forward(given: tuple, parts: tuple, input_positions: tuple) -> bool:
    """Keeps a forward's launch (forward.replay_parts' parts) for calls of given's signature,
    its input sources (q, k, v, then the sequences' tensors) read from the arguments at
    input_positions; False as keep_decode."""
    if not ready():
        return False
    launches, roles, lse_dims, input_sources = parts
    pairs = [value for source, position in zip(input_sources, input_positions)
             for value in (source, position)]
    return _module.keep_forward(given, pairs, launches, roles, lse_dims, input_positions[0])


def keep_backward(given: tuple, parts: tuple, input_positions: tuple, heads_first: bool) -> bool:
    """Keeps a backward's launch (backward.replay_parts' parts) for calls of given's signature,
    its input sources (q, k, v, out, dout, lse) read from the arguments at input_positions and
    dq, dk, dv shaped like the first three; False as keep_decode, and where the backward's
    replay is off."""
    if not ready() or backward is not _module.backward:
        return False
    launches, roles, scratch_floats = parts
    pairs = [value for source, position in enumerate(input_positions)
             for value in (source, position)]
    return _module.keep_backward(given, pairs, launches, roles, input_positions[:3],
                                 scratch_floats, heads_first, input_positions[0])


def replays() -> int:
    """How many calls the compiled replay has launched in this process (0 where not loaded)."""
    return _module.replays() if _module is not None else 0


def split_counters() -> list:
    """The split counters the compiled replay keeps per stream (tests: every one back at 0)."""
    return _module.split_counters() if _module is not None else []


def forget() -> None:
    """Drops every kept plan (decode.clear_plans)."""
    global generation
    generation += 1
    if _module is not None:
        _module.forget()


def reset() -> None:
    """Unloads nothing but starts over: the next call reads FLASHGEN_REPLAY and the cache
    again (tests)."""
    global decode, forward, backward
    forget()
    decode, forward, backward = _first_decode, _first_forward, _first_backward
