"""The runtime apart from the generator: a call of a built kernel, from flash_attn_func down to
the kernel, loads it from the cache without Jinja, the renderer or the build. The call runs in a
fresh process on a CPU: its tensors report cuda:0, the kernels are host-compiled stand-ins
published into a cache by flashgen/cache.py, as a build publishes them, and the binding is the
real one, built with the host compiler (as in test_binding_cpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("pybind11")

from codegen import build, paths  # noqa: E402
from codegen.config import load_config  # noqa: E402
from codegen.spec import enumerate_specs  # noqa: E402
from flashgen import cache  # noqa: E402

GENERATOR = ("jinja2", "codegen.render", "codegen.build", "codegen.ninja")
HEAD_DIM = 64
# Every forward a bf16 hd64 call without a mask may run on an sm_80 (the mma family's tiles).
SPECS = enumerate_specs(load_config(paths.DEFAULT_CONFIG), archs=["sm_80"],
                        head_dims=[HEAD_DIM], dtypes=["bf16"], masks=["none"], kinds=["fwd"],
                        score_mods=["none"], dropout=False)

# A forward that writes ones into out and seqlen_k into lse, and counts its calls.
KERNEL = """
#include <cstdint>
#include "flashgen/common/params.h"

static int calls = 0;

extern "C" int flashgen_test_calls() { return calls; }
extern "C" const char* flashgen_error_string(int) { return "test kernel"; }

static int forward(const flashgen::FwdParams* p) {
  ++calls;
  for (int b = 0; b < p->batch; ++b)
    for (int r = 0; r < p->seqlen_q; ++r)
      for (int h = 0; h < p->heads; ++h)
        for (int d = 0; d < HEAD_DIM; ++d)
          static_cast<uint16_t*>(p->o)[b * p->o_batch_stride + r * p->o_row_stride +
                                       h * p->o_head_stride + d] = 0x3f80;  // bf16 1.0
  for (int i = 0; i < p->batch * p->heads * p->seqlen_q; ++i)
    p->softmax_lse[i] = float(p->seqlen_k);
  return 0;
}
"""

CALL = f"""
import sys
from types import SimpleNamespace

import torch

import flashgen
from flashgen import host, loader

# The tensors report cuda:0 and the device an A100's properties; allocations stay on the CPU.
cuda0 = torch.device("cuda", 0)
torch.Tensor.device = property(lambda t: cuda0)
torch.Tensor.is_cuda = property(lambda t: True)
torch.Tensor.get_device = lambda t: 0
torch.cuda.get_device_properties = lambda index: SimpleNamespace(
    major=8, minor=0, multi_processor_count=108, L2_cache_size=40 << 20)
host._current_stream = lambda index: 0
host._current_device = lambda: 0

q = torch.randn(2, 48, 4, {HEAD_DIM}, dtype=torch.bfloat16)
k = torch.randn(2, 80, 2, {HEAD_DIM}, dtype=torch.bfloat16)
out, lse = flashgen.flash_attn_func(q, k, k.clone(), return_attn_probs=True)[:2]
assert bool((out == 1).all()) and bool((lse == 80).all()), (out, lse)
(launcher,) = loader._launchers.values()
assert launcher.library.flashgen_test_calls() == 1
print(launcher.spec.name)
print(sorted(m for m in {GENERATOR!r} if m in sys.modules))
"""


@pytest.fixture
def built_cache(tmp_path, monkeypatch, host_library):
    """A cache holding the binding and, for each of SPECS, an entry with a stand-in kernel."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    build.build_binding(log=lambda message: None)
    source = KERNEL.replace("HEAD_DIM", str(HEAD_DIM)) + "".join(
        f'extern "C" int {spec.name}(const flashgen::FwdParams* p, void*) '
        f"{{ return forward(p); }}\n" for spec in SPECS)
    library = host_library("kernels", source)
    for spec in SPECS:
        cache.publish(spec, library._name, "a test's nvcc", resources={})
    return tmp_path / "cache"


def test_a_call_of_a_built_kernel_imports_no_generator(built_cache, tmp_path):
    # No nvcc (so any entry built from the same inputs loads) and no JIT: a miss fails loudly.
    env = dict(os.environ, FLASHGEN_CACHE_DIR=str(built_cache), FLASHGEN_JIT="0",
               CUDA_HOME=str(tmp_path / "nowhere"), PATH=str(tmp_path / "nowhere"),
               PYTHONPATH=str(paths.REPO_ROOT))
    result = subprocess.run([sys.executable, "-c", CALL], env=env, cwd=paths.REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    name, imported = result.stdout.splitlines()
    assert name in {spec.name for spec in SPECS}
    assert imported == "[]", f"the call imported {imported}"


def _imports() -> dict[str, set[str]]:
    """Each flashgen and codegen module's imports of the two packages' modules, at module level
    or inside a function, except the package flashgen's own (its __getattr__ imports the public
    functions' modules on first use, so that `import flashgen` stays cheap)."""
    import ast

    modules = {}
    for package in ("flashgen", "codegen"):
        for path in (paths.REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(paths.REPO_ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        graph[name] = set()
        if name == "flashgen":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    graph[name].add(submodule if submodule in modules else node.module)
        # a module's own package is imported before it, never by it
        graph[name] = {m for m in graph[name] if m in modules and not name.startswith(m + ".")}
    return graph


def test_no_import_cycle_even_through_function_level_imports():
    graph = _imports()
    done, on_path = set(), []

    def visit(module):
        if module in on_path:
            raise AssertionError(f"import cycle: {' -> '.join(on_path[on_path.index(module):])}"
                                 f" -> {module}")
        if module in done:
            return
        on_path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        on_path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
