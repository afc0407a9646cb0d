"""The `flashgen` command: generate (render + compile), list, --version."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from codegen import build, paths, render
from codegen.arch import ARCHS
from codegen.config import DTYPES, ConfigError, load_config
from codegen.spec import enumerate_specs


def _parser() -> argparse.ArgumentParser:
    from flashgen import __version__

    parser = argparse.ArgumentParser(prog="flashgen", description=__doc__)
    parser.add_argument("--version", action="version", version=f"flashgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_selection(p):
        p.add_argument("--config", type=Path, default=None,
                       help="config TOML (default: $FLASHGEN_CONFIG or the packaged default)")
        p.add_argument("--arch", action="append", choices=sorted(ARCHS),
                       help="target GPU arch; repeat for several")
        p.add_argument("--head-dim", type=int, action="append", help="only these head dims")
        p.add_argument("--dtype", action="append", choices=DTYPES, help="only these dtypes")
        p.add_argument("--causal", choices=("true", "false"), help="only causal or non-causal")

    gen = sub.add_parser("generate", help="render the config's kernels and compile them")
    add_selection(gen)
    gen.add_argument("--out", type=Path, default=None,
                     help="where rendered sources go (default: generated/ for the packaged "
                          "config, else <cache>/generated)")
    gen.add_argument("--jobs", "-j", type=int, default=None, help="parallel nvcc processes")
    gen.add_argument("--dry-run", action="store_true", help="render only, compile nothing")

    bench = sub.add_parser("bench", help="time flashgen against PyTorch's SDPA backends (GPU)")
    bench.add_argument("--dtype", action="append", choices=DTYPES)
    bench.add_argument("--head-dim", type=int, action="append")
    bench.add_argument("--seqlen", type=int, action="append")
    bench.add_argument("--causal", choices=("true", "false"))

    lst = sub.add_parser("list", help="configured kernels and where they are built")
    add_selection(lst)
    return parser


def _selected(args):
    config_path = args.config or paths.config_path()
    config = load_config(config_path)
    specs = enumerate_specs(
        config, archs=args.arch, head_dims=args.head_dim, dtypes=args.dtype,
        causal=None if args.causal is None else [args.causal == "true"])
    return config, specs


def _generate(args) -> int:
    config, selected = _selected(args)
    default_config = config.path.resolve() == paths.DEFAULT_CONFIG.resolve()
    out = args.out or (paths.GENERATED_DIR if default_config else paths.cache_dir() / "generated")
    changed = render.render_tree(enumerate_specs(config), out)
    print(f"flashgen: rendered {len(enumerate_specs(config))} kernel(s) of {config.path} into "
          f"{out} ({len(changed)} file(s) changed)")
    if args.dry_run:
        return 0
    if not args.arch:
        print("flashgen: nothing compiled: pass --arch (e.g. --arch sm_90), or --dry-run to "
              "render only", file=sys.stderr)
        return 2
    if not selected:
        print("flashgen: no configured kernel matches the filters", file=sys.stderr)
        return 2
    start = time.monotonic()
    entries = build.build(selected, jobs=args.jobs)
    where = sorted({str(e.path.parent) for e in entries})
    print(f"flashgen: {len(entries)} kernel(s) ready for {', '.join(args.arch)} in "
          f"{time.monotonic() - start:.0f}s -> {', '.join(where)}")
    if not default_config:
        print(f"flashgen: to use this config at run time, set FLASHGEN_CONFIG={config.path}")
    return 0


def _list(args) -> int:
    _, specs = _selected(args)
    for spec in specs:
        entry = build.find_entry(spec)
        print(f"{spec.name:48s} {spec.arch}  {'built  ' + str(entry.path) if entry else 'not built'}")
    print(f"{len(specs)} kernel(s)")
    return 0


def _bench(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("flashgen bench: no CUDA GPU on this machine; run it where one is", file=sys.stderr)
        return 1
    from flashgen import bench

    bench.run(dtypes=args.dtype or ("bf16",), head_dims=args.head_dim or (64, 128, 256),
              seqlens=args.seqlen or (4096,),
              causal=(False, True) if args.causal is None else (args.causal == "true",))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"generate": _generate, "list": _list, "bench": _bench}[args.command](args)
    except (ConfigError, build.BuildError, FileNotFoundError, TimeoutError) as e:
        print(str(e), file=sys.stderr)
        return 1
