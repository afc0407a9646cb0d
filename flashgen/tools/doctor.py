"""`flashgen doctor`: what a call on this machine needs and what an issue report should say, in one
command. Each check is a line: ok, or missing with the fix; the exit code is 1 where something a
call needs is missing."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    found: str          # what is there ("" where nothing is)
    fix: str = ""       # how to get it, where it is missing
    needed: bool = True  # a call needs it (else it is information)

    @property
    def ok(self) -> bool:
        return bool(self.found)

    def line(self) -> str:
        if self.ok:
            return f"  ok       {self.name}: {self.found}"
        mark = "MISSING" if self.needed else "absent "
        return f"  {mark}  {self.name}: {self.fix}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def checks() -> list[Check]:
    import torch

    from codegen import paths
    from codegen.arch import arch_for_capability
    from flashgen import cache, registry

    found = [Check("python", platform.python_version()),
             Check("torch", f"{torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
                            f"{torch.backends.cudnn.version() if torch.cuda.is_available() else '-'})")]
    arch = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = arch_for_capability(major, minor)
        found.append(Check("GPU", f"{torch.cuda.get_device_name()} (compute capability "
                                  f"{major}.{minor}, {arch})"))
    else:
        found.append(Check("GPU", "", "no CUDA GPU is visible to torch: flashgen's calls run on "
                                      "one (check CUDA_VISIBLE_DEVICES and `nvidia-smi`, and that "
                                      "torch is a CUDA build)"))
    nvcc = cache.nvcc_version()
    found.append(Check("nvcc", f"{paths.nvcc_path()} ({nvcc})" if nvcc else "",
                       "not found: install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH "
                       "or set CUDA_HOME; without it only built kernels load", needed=False))
    try:
        found.append(Check("CUTLASS", f"{cache.cutlass_version()} ({paths.cutlass_include_dir()})"))
    except FileNotFoundError as error:
        found.append(Check("CUTLASS", "", str(error), needed=nvcc is not None))
    config = registry.active_config()
    found.append(Check("config", f"{config.path} (archs {', '.join(config.archs)}, families "
                                 f"{', '.join(config.families)})"))
    if arch is not None:
        if arch in config.archs:
            specs = [s for s in registry.specs() if s.arch == arch]
            entries = [e for e in map(cache.find_entry, specs) if e is not None]
            packaged = sum(cache.package_of(e) is not None for e in entries)
            built = len(entries)
            families = sorted({s.family for s in specs})
            packages = (f", {packaged} of them from kernel packages "
                        f"({', '.join(sorted(cache.package_roots()))})" if packaged else "")
            found.append(Check(f"kernels for {arch}",
                               f"{built} of {len(specs)} built in {paths.cache_dir() / arch}"
                               f"{packages}; families {', '.join(families)}"))
            if not built and nvcc is None:
                found.append(Check("a way to get kernels", "", f"no kernel is built for {arch} "
                                   f"and no nvcc can compile one: install the CUDA toolkit, "
                                   f"build elsewhere into FLASHGEN_CACHE_DIR, or pip install a "
                                   f"kernel package (`flashgen pack`)"))
        else:
            found.append(Check(f"kernels for {arch}", "",
                               f"{config.path} configures no kernels for {arch}: add "
                               f"[mma.{arch}.head_dim.N] tables (docs/config.md)"))
    else:
        found.append(Check("cache", str(paths.cache_dir()), needed=False))
    found.append(Check("JIT", "on (FLASHGEN_JIT=0 turns it off)" if paths.jit_enabled()
                       else "off: an unbuilt kernel raises instead of compiling", needed=False))
    replay = cache.replay_path()
    found.append(Check("replay of known calls",
                       f"built ({replay.parent})" if replay.is_file() else "",
                       "not built: repeated calls run from Python (the first call builds it in the "
                       "background, as `flashgen generate` does)", needed=False))
    for name, package in (("transformers", "transformers"), ("FlashAttention-4", "flash-attn-4")):
        version = _version(package)
        found.append(Check(name, version, "not installed (optional)", needed=False))
    registry_api = hasattr(getattr(torch.nn, "attention", None), "register_flash_attention_impl")
    found.append(Check("torch's flash-attention registry",
                       "torch.nn.attention.register_flash_attention_impl" if registry_api else "",
                       "not in this torch (optional: PyTorch's SDPA backend)", needed=False))
    return found


def run(print_line=print) -> int:
    """Prints every check; 1 where something a call needs is missing, else 0."""
    from flashgen import __version__

    print_line(f"flashgen {__version__}")
    results = checks()
    for check in results:
        print_line(check.line())
    missing = [c for c in results if c.needed and not c.ok]
    if missing:
        print_line(f"flashgen doctor: {len(missing)} thing(s) a call needs are missing: "
                   f"{', '.join(c.name for c in missing)}")
        return 1
    print_line("flashgen doctor: everything a call needs is here")
    return 0
