"""FlashAttention-2's own test suite, run against flashgen.

test_flash_attn.py is tests/test_flash_attn.py of Dao-AILab/flash-attention at commit 0251105a
(FA2 2.8.4), unmodified, under its BSD licence (LICENSE beside it). flashgen.compat.install()
makes its `import flash_attn` resolve to flashgen.

Its parametrize marks describe about 196,000 cases without dropout at head dims 40-128 alone (152,000
of them in test_flash_attn_kvcache), too many for one GPU run, so every run draws a seeded random
sample of each test function's cases before pytest creates them: at most FLASHGEN_FA2_PER_TEST
(default 400) per function, every case of a function with fewer. The seed is drawn anew for each
run and printed in the header; FLASHGEN_FA2_SEED=N replays a run. Which head dims and dtypes take
part:
    FLASHGEN_FA2_HEAD_DIMS   comma-separated (default 40,59,64,111,128: 64 and 128 and the dims
                             flashgen pads to them); "all" keeps every head dim the suite lists
    FLASHGEN_FA2_DTYPES      fp16,bf16 (default both)
    FLASHGEN_FA2_FIX         name=value,... keeps only the cases with those arguments (e.g.
                             alibi=False,local=False for a machine with the plain kernels
                             built); a run narrowed so is not the conformance run
The one exclusion: the dropout cases of the four tests that read S_dmask, FA2's debug return of
the dropout pattern (test_flash_attn_qkvpacked, test_flash_attn_varlen_qkvpacked,
test_flash_attn_output, test_flash_attn_varlen_output); flashgen returns no S_dmask.

The kernels a conformance run calls, built ahead of it (on sm_90; the rest compile on first use):
    flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --mask none --mask causal \
        --mask window --score-mod none --score-mod softcap --score-mod alibi \
        --score-mod softcap_alibi --preferred --dropout without                 (200 kernels)
    flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --mask none --mask causal \
        --score-mod none --dtype fp16 --dropout with --preferred                (9: the dropout
        cases of test_flash_attn_race_condition)
and for the run over the other head dims the first with --dtype bf16 and --head-dim 32, 96, 192
and 256 (112 kernels). Two runs of 4,329 cases each took 390 s side by side on the H200 (-n 6
each, pytest-xdist), the other head dims' 3,488 61 s (bench/results/fa2-conformance/).

Calls run with FLASHGEN_DEBUG_CHECKS=1, which reads back and checks the device values FA2
checks (a sync per call). Without a CUDA GPU the module still imports (its module-level capability queries read sm_90 while
it is collected), the selection runs, and every selected case is skipped: CI checks the
selection (tests/test_fa2_selection.py), the GPU run checks flashgen.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from flashgen import compat

VENDORED = Path(__file__).with_name("test_flash_attn.py")
DEFAULT_HEAD_DIMS = (40, 59, 64, 111, 128)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
READS_S_DMASK = frozenset({"test_flash_attn_qkvpacked", "test_flash_attn_varlen_qkvpacked",
                           "test_flash_attn_output", "test_flash_attn_varlen_output"})
HEAD_DIM_ARGUMENT = "d"

compat.install()


@dataclass(frozen=True)
class Selection:
    seed: int
    head_dims: frozenset[int] | None  # None: every head dim
    dtypes: frozenset
    per_test: int
    fixed: tuple[tuple[str, object], ...] = ()

    @classmethod
    def from_environment(cls) -> "Selection":
        seed = os.environ.get("FLASHGEN_FA2_SEED")
        dims = os.environ.get("FLASHGEN_FA2_HEAD_DIMS", ",".join(map(str, DEFAULT_HEAD_DIMS)))
        dtypes = os.environ.get("FLASHGEN_FA2_DTYPES", "fp16,bf16")
        unknown = set(dtypes.split(",")) - DTYPES.keys()
        if unknown:
            raise pytest.UsageError(f"FLASHGEN_FA2_DTYPES: unknown {sorted(unknown)}; "
                                    f"choose from {sorted(DTYPES)}")
        return cls(seed=int(seed) if seed else random.SystemRandom().randrange(1 << 31),
                   head_dims=None if dims == "all" else frozenset(int(d) for d in dims.split(",")),
                   dtypes=frozenset(DTYPES[name] for name in dtypes.split(",")),
                   per_test=int(os.environ.get("FLASHGEN_FA2_PER_TEST", "400")),
                   fixed=tuple((name, ast.literal_eval(value)) for name, value in
                               (item.split("=", 1) for item in
                                os.environ.get("FLASHGEN_FA2_FIX", "").split(",") if item)))

    def keeps(self, test: str, argname: str, value) -> bool:
        for name, fixed in self.fixed:
            if argname == name and value != fixed:
                return False
        if argname == HEAD_DIM_ARGUMENT and self.head_dims is not None:
            return value in self.head_dims
        if argname == "dtype":
            return value in self.dtypes
        if argname == "dropout_p" and test in READS_S_DMASK:
            return value == 0.0
        return True


SELECTION = Selection.from_environment()
SELECTED: dict[str, tuple[int, int]] = {}  # test function -> (cases selected, cases it lists)


def sample_cases(test: str, axes: list[tuple[list[str], list]], selection: Selection,
                 rng: random.Random) -> tuple[list[tuple], int]:
    """Each axis is one parametrize mark: its argument names and its values (a tuple of values per
    entry when it names several). Returns the sampled cases, each a tuple of one entry per axis,
    and how many cases the filtered axes hold. Indices are drawn from the mixed-radix product, so
    the product is never materialised."""
    kept = [[value for value in values
             if all(selection.keeps(test, name, part)
                    for name, part in zip(names, value if len(names) > 1 else (value,)))]
            for names, values in axes]
    total = math.prod(len(values) for values in kept)
    if total <= selection.per_test:
        return list(itertools.product(*kept)), total
    cases = []
    for index in sorted(rng.sample(range(total), selection.per_test)):
        case = []
        for values in reversed(kept):
            index, digit = divmod(index, len(values))
            case.append(values[digit])
        cases.append(tuple(reversed(case)))
    return cases, total


def _value_id(value) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value)


@pytest.hookimpl(hookwrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """Replaces a vendored test's parametrize marks by one mark over the sampled cases (the
    function object's marks only: the file is untouched). Ids list the values in the order
    pytest would (the mark nearest the function first)."""
    if (getattr(collector, "path", None) == VENDORED and name.startswith("test_")
            and callable(obj) and hasattr(obj, "pytestmark")):
        marks = obj.pytestmark
        parametrized = [m for m in marks if m.name == "parametrize"]
        if parametrized:
            axes = []
            for mark in parametrized:
                names = [n.strip() for n in mark.args[0].split(",")] if isinstance(
                    mark.args[0], str) else list(mark.args[0])
                axes.append((names, list(mark.args[1])))
            # A per-function stream: one function's sample does not depend on the others'.
            rng = random.Random(f"{SELECTION.seed}:{name}")
            cases, total = sample_cases(name, axes, SELECTION, rng)
            SELECTED[name] = (len(cases), total)
            argnames = [n for names, _ in axes for n in names]
            rows = [tuple(itertools.chain.from_iterable(
                value if len(names) > 1 else (value,) for (names, _), value in zip(axes, case)))
                for case in cases]
            ids = ["-".join(_value_id(v) for v in row) for row in rows]
            others = [m for m in marks if m.name != "parametrize"]
            obj.pytestmark = [*others, pytest.mark.parametrize(argnames, rows, ids=ids).mark]
        else:
            SELECTED[name] = (1, 1)
    yield


@pytest.fixture(autouse=True)
def _fa2_contract(monkeypatch):
    """FA2's: dK and dV the same bits every run (what compat.install() sets for its process; the
    top-level conftest resets it for every test)."""
    from flashgen import schedule

    monkeypatch.setattr(schedule, "_dkdv_reproducible", True)


@pytest.fixture(autouse=True)
def _device_values_checked(monkeypatch):
    """FA2 reads device values back to check them (cache_seqlens against its block table's
    capacity, for one); flashgen does under FLASHGEN_DEBUG_CHECKS=1 (a sync per call)."""
    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")


@contextlib.contextmanager
def _reads_as_sm90():
    """The vendored module asks for the GPU's capability at import; without a GPU it reads sm_90
    while it is collected, so the selection can run on a CPU."""
    real = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    if getattr(collector, "path", None) == VENDORED and not torch.cuda.is_available():
        with _reads_as_sm90():
            yield
    else:
        yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="FlashAttention-2's suite runs flashgen's kernels: needs a "
                                   "CUDA GPU (the selection itself ran)")
    for item in items:
        if Path(item.path) == VENDORED:
            item.add_marker(skip)


def pytest_report_header(config):
    dims = ("all" if SELECTION.head_dims is None
            else ",".join(map(str, sorted(SELECTION.head_dims))))
    dtypes = ",".join(name for name, d in DTYPES.items() if d in SELECTION.dtypes)
    return (f"FlashAttention-2 suite (0251105a) sample: FLASHGEN_FA2_SEED={SELECTION.seed} "
            f"FLASHGEN_FA2_HEAD_DIMS={dims} FLASHGEN_FA2_DTYPES={dtypes} "
            f"FLASHGEN_FA2_PER_TEST={SELECTION.per_test}"
            + (f" FLASHGEN_FA2_FIX={os.environ['FLASHGEN_FA2_FIX']} (narrowed: not the "
               f"conformance run)" if SELECTION.fixed else ""))


def pytest_terminal_summary(terminalreporter):
    if not SELECTED:
        return
    write = terminalreporter.write_line
    write(f"FlashAttention-2 suite sample: {sum(n for n, _ in SELECTED.values())} cases "
          f"selected; FLASHGEN_FA2_SEED={SELECTION.seed} replays it")
    for name, (selected, total) in sorted(SELECTED.items()):
        write(f"  {name}: {selected} of {total}")
