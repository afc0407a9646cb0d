"""The `flashgen` command: `generate` renders the config's kernels and compiles a selection of
them, `list` shows the configured kernels and which are built, `bench` times flashgen against
PyTorch's attention backends (GPU), `tune` picks tiles on this GPU, `doctor` says what a call on
this machine needs and what is missing, `--version`."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

from codegen import build, paths, render
from codegen import families
from codegen.arch import ARCHS, arch_for_capability
from codegen.config import DTYPES, ConfigError, load_config
from codegen.masks import MASKS
from codegen.score_mods import SCORE_MODS
from codegen.spec import KINDS, KernelSpec, enumerate_specs
from flashgen import cache, dispatch


def _parser() -> argparse.ArgumentParser:
    from flashgen import __version__
    from flashgen.tools.bench import MODES, SERVING_MODES, VARIANTS_MODE

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
        p.add_argument("--mask", action="append", metavar="MASK",
                       help=f"only kernels of these mask kinds ({', '.join(sorted(MASKS))}, or "
                            f"a config-defined variant's mask)")
        p.add_argument("--score-mod", action="append", metavar="SCORE_MOD",
                       help=f"only kernels of these score modifiers "
                            f"({', '.join(sorted(SCORE_MODS))}, or a variant's)")
        p.add_argument("--kind", action="append", choices=KINDS,
                       help="only forward (fwd), backward (bwd) or KV-cache kernels (kvcache: "
                            "flash_attn_with_kvcache's decode and chunked prefill) (default: "
                            "all)")
        p.add_argument("--family", action="append", choices=sorted(families.FAMILIES),
                       help="only these kernel families (default: every configured one)")
        p.add_argument("--dropout", choices=("with", "without"), default=None,
                       help="only kernels with dropout, or only those without (default: both)")
        p.add_argument("--preferred", action="store_true",
                       help="only the family each selected call runs on first (its tiles): "
                            "what a call that forces no family and needs no fallback runs; "
                            "the others compile on first use")

    gen = sub.add_parser("generate", help="render the config's kernels and compile them")
    add_selection(gen)
    gen.add_argument("--out", type=Path, default=None,
                     help="where rendered sources go (default: a checkout's generated/ for the "
                          "packaged config, else <cache>/generated)")
    gen.add_argument("--jobs", "-j", type=int, default=None, help="parallel nvcc processes")
    gen.add_argument("--dry-run", action="store_true", help="render only, compile nothing")

    bench = sub.add_parser("bench", help="time flashgen against PyTorch's SDPA backends (GPU)")
    bench.add_argument("--dtype", action="append", choices=DTYPES)
    bench.add_argument("--head-dim", type=int, action="append")
    bench.add_argument("--seqlen", type=int, action="append")
    bench.add_argument("--causal", choices=("true", "false"))
    bench.add_argument("--batch", type=int, help="batch size of every cell (default: 16k tokens "
                       "/ seqlen); 1 shows where the forward's shape-aware tile choice pays")
    bench.add_argument("--heads", type=int, help="heads of every cell (default: 2048 / head dim)")
    bench.add_argument("--impl", action="append", help="implementations to time (default: all "
                       "of flashgen, FLASH_ATTENTION, CUDNN_ATTENTION, FA4 (FlashAttention-4, "
                       "where flash-attn-4 is importable), EFFICIENT_ATTENTION, MATH; "
                       "on request flashgen_deterministic, and flashgen_main_tile or "
                       "flashgen_alt_tile: the forward on one tile whatever the shape)")
    bench.add_argument("--mode", action="append",
                       choices=MODES + SERVING_MODES + (VARIANTS_MODE,),
                       help="fwd, bwd (the backward after an untimed forward) or fwd_bwd; repeat "
                       "for several (default: fwd and bwd; with --memory: fwd and fwd_bwd); or "
                       "alone, decode or prefill: attention over a KV cache "
                       "(flashgen/tools/bench/serving.py; --dtype, --head-dim, --batch and "
                       "--seqlen, the cache length, narrow its grid); or alone, variants: "
                       "windows and softcap against FlexAttention "
                       "(flashgen/tools/bench/variants.py; --head-dim narrows it)")
    bench.add_argument("--case", action="append", help="with --mode variants: only the cases "
                       "whose names start with this (causal, window, softcap, alibi, document, "
                       "dropout); repeat for several")
    bench.add_argument("--out", type=Path, help="write results.json and results.md here")
    bench.add_argument("--memory", action="store_true", help="peak memory of one forward call and "
                       "of forward + backward, seqlen 1k..128k, instead of speed")
    bench.add_argument("--overhead", action="store_true",
                       help="host microseconds of a tiny call, instead of speed")
    bench.add_argument("--plot", type=Path, metavar="RESULTS_JSON",
                       help="only plot a results.json (no GPU needed) to results-<mode>.png "
                       "beside it, one per mode")

    tune = sub.add_parser("tune", help="time candidate tiles on this GPU; --write puts the "
                          "winners into the config")
    add_selection(tune)
    tune.add_argument("--direction", action="append", choices=("fwd", "bwd", "fwd_fp8"),
                      help="the pass to tune: the forward (fwd), backward (bwd) or e4m3 forward "
                           "(fwd_fp8) kind, as --kind")
    tune.add_argument("--seqlen", type=int, default=4096, help="timed seqlen (default 4096)")
    tune.add_argument("--write", action="store_true", help="write the winners into the config")
    tune.add_argument("--out", type=Path, help="write every candidate's row to this JSON file")

    lst = sub.add_parser("list", help="configured kernels and where they are built")
    add_selection(lst)
    pack = sub.add_parser("pack", help="a wheel of the selected kernels (built first where "
                          "missing) that `pip install` makes loadable without nvcc")
    add_selection(pack)
    pack.add_argument("--out", type=Path, default=Path("dist"), help="folder of the wheel "
                      "(default: dist/)")
    pack.add_argument("--name", default=None, help="the pack's name: the wheel is "
                      "flashgen_kernels_<name> (default: the archs, e.g. sm90)")
    pack.add_argument("--jobs", "-j", type=int, default=None, help="parallel nvcc processes")
    sub.add_parser("doctor", help="what a call on this machine needs, found or missing with "
                   "its fix (GPU, torch, nvcc, CUTLASS, the cache, the integrations)")
    return parser


class UsageError(ValueError):
    """A filter that names nothing the config has; exit code 2."""


def _check_names(option: str, asked, known) -> None:
    for name in asked or ():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"flashgen: unknown {option} {name!r}{hint} The config has: "
                             f"{', '.join(sorted(known))}")


def _check_filters(args, config) -> None:
    """Names the filter value that selects nothing, before any kernel is enumerated."""
    masks = set(config.masks) | {v.name for v in config.variants if v.mask_mod}
    score_mods = set(config.score_mods) | {v.name for v in config.variants if v.score_mod}
    _check_names("--mask", args.mask, masks)
    _check_names("--score-mod", args.score_mod, score_mods)
    for arch in args.arch or ():
        if arch not in config.archs:
            raise UsageError(
                f"flashgen: {config.path} has no kernels for {arch} (it configures "
                f"{', '.join(config.archs)}); add [mma.{arch}.head_dim.N] tables for it "
                f"(docs/config.md: its shared-memory limit is its own)")


def _selected(args):
    config_path = args.config or paths.config_path()
    config = load_config(config_path)
    _check_filters(args, config)
    specs = enumerate_specs(config, archs=args.arch, head_dims=args.head_dim, dtypes=args.dtype,
                            masks=args.mask, kinds=args.kind, family_names=args.family,
                            score_mods=args.score_mod,
                            dropout=None if args.dropout is None else args.dropout == "with")
    if args.preferred:
        specs = preferred(specs, tuple(enumerate_specs(config)))
    return config, specs


def preferred(specs: list[KernelSpec], configured: tuple[KernelSpec, ...]) -> list[KernelSpec]:
    """The specs of the family that dispatch tries first for their own call (arch, kind, dtype,
    head dim, mask, score modifier, dropout), among every configured spec."""
    first = {}
    for spec in specs:
        call = (spec.arch, spec.kind, spec.dtype, spec.head_dim, spec.mask, spec.score_mod,
                spec.dropout)
        if call not in first:
            (choice, *_) = dispatch.candidates(configured, *call[:6], dropout=spec.dropout)
            first[call] = choice.spec.family
    return [s for s in specs if s.family == first[(s.arch, s.kind, s.dtype, s.head_dim, s.mask,
                                                   s.score_mod, s.dropout)]]


def _generate(args) -> int:
    config, selected = _selected(args)
    default_config = config.path.resolve() == paths.DEFAULT_CONFIG.resolve()
    # generated/ is a checkout's reviewed render of the default config; an installed package
    # has none, and renders into the cache rather than into site-packages.
    review_copy = default_config and paths.FROM_CHECKOUT and paths.GENERATED_DIR.is_dir()
    out = args.out or (paths.GENERATED_DIR if review_copy else paths.cache_dir() / "generated")
    configured = enumerate_specs(config)
    changed = render.render_tree(configured, out)
    print(f"flashgen: rendered the samples and summary of {config.path}'s {len(configured)} "
          f"kernel(s) into {out} ({len(changed)} file(s) changed); the filters select "
          f"{len(selected)}")
    if args.dry_run:
        return 0
    if not args.arch:
        print("flashgen: nothing compiled: pass --arch (e.g. --arch sm_90), or --dry-run to "
              "render only", file=sys.stderr)
        return 2
    if not selected:
        print(f"flashgen: no configured kernel matches the filters (head dims configured for "
              f"{', '.join(args.arch)}: {_head_dims(config, args.arch)})", file=sys.stderr)
        return 2
    built_already = all(cache.find_entry(spec) is not None for spec in selected)
    entries = build.build(selected, jobs=args.jobs)  # it says what it compiles and how long
    build.build_binding()  # else the first call builds it (20 s on the H200 host)
    _build_replay(build)
    if built_already:
        where = sorted({str(e.path.parent) for e in entries})
        print(f"flashgen: all {len(entries)} kernel(s) were built already -> {', '.join(where)}")
    for entry in entries:
        if entry.resources.get("wgmma_serialised"):
            print(f"flashgen: warning: {entry.spec.name}: ptxas serialised its wgmma instructions "
                  f"for want of registers (C7512), which costs much of its speed: give its tile "
                  f"fewer accumulators (a smaller block_m or block_n)", file=sys.stderr)
    if not default_config:
        print(f"flashgen: to use this config at run time, set FLASHGEN_CONFIG={config.path}")
    return 0


def _build_replay(build) -> None:
    """The compiled replay of known calls, where this torch can run one (a CUDA build);
    optional, so a failure is a warning (calls then run from Python)."""
    import torch

    if torch.version.cuda is None:
        return
    try:
        build.build_replay()
    except Exception as error:  # noqa: BLE001 - BuildError, or torch without its headers
        print(f"flashgen: warning: the replay of known calls did not build, so repeated "
              f"calls run from Python: {error}", file=sys.stderr)


def _head_dims(config, archs) -> str:
    return ", ".join(str(d) for d in sorted({d for family in config.families for arch in archs
                                             for kind in KINDS
                                             for d in config.head_dims(family, kind, arch)}))


def _list(args) -> int:
    _, specs = _selected(args)
    for spec in specs:
        entry = cache.find_entry(spec)
        if entry is None:
            print(f"{spec.name:52s} not built")
            continue
        r = entry.resources
        serialised = ", wgmma serialised (C7512)" if r.get("wgmma_serialised") else ""
        package = cache.package_of(entry)
        where = entry.path if package is None else f"{entry.path} (package {package})"
        print(f"{spec.name:52s} built  {r.get('registers', '?')} registers, "
              f"{r.get('spill_bytes', '?')} bytes spilled{serialised}  {where}")
    print(f"{len(specs)} kernel(s)")
    return 0


def _pack(args) -> int:
    from flashgen.tools import pack

    if not args.arch:
        print("flashgen pack: pass --arch (e.g. --arch sm_90): a pack holds one GPU's kernels",
              file=sys.stderr)
        return 2
    _, selected = _selected(args)
    if not selected:
        print("flashgen pack: no configured kernel matches the filters", file=sys.stderr)
        return 2
    entries = [cache.find_entry(spec) for spec in selected]
    missing = [spec for spec, entry in zip(selected, entries) if entry is None]
    if missing:  # it says what it compiles and how long
        build.build(missing, jobs=args.jobs)
        entries = [cache.find_entry(spec) for spec in selected]
    label = args.name or "_".join(a.replace("_", "") for a in sorted(set(args.arch)))
    wheel = pack.write_wheel(entries, args.out, label)
    print(f"flashgen pack: {len(entries)} kernel(s) -> {wheel}; `pip install {wheel}` makes "
          f"them loadable (no nvcc needed)")
    return 0


def _bench(args) -> int:
    import json

    from flashgen.tools import bench

    if args.plot:
        result = bench.upgraded(json.loads(args.plot.read_text()))
        for png in bench.plot(result, args.plot.with_suffix(".png")):
            print(f"flashgen bench: wrote {png}")
        return 0
    problem = _bench_argument_problem(args)
    if problem:
        print(f"flashgen bench: {problem}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("flashgen bench: no CUDA GPU on this machine; run it where one is", file=sys.stderr)
        return 1
    if args.overhead:
        print(bench.overhead_us())
        return 0
    if args.mode and args.mode[0] in bench.SERVING_MODES:
        return _bench_serving(args)
    if args.mode and args.mode[0] == bench.VARIANTS_MODE:
        return _bench_variants(args)
    impls = tuple(args.impl) if args.impl else None
    modes = tuple(args.mode) if args.mode else None
    if args.memory:
        rows = bench.memory(seqlens=tuple(args.seqlen or bench.MEMORY_SEQLENS),
                            impls=impls or bench.MEMORY_IMPLS, modes=modes or bench.MEMORY_MODES)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "memory.json").write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    grid = bench.DEFAULT_GRID
    result = bench.run(
        dtypes=args.dtype or grid["dtypes"], head_dims=args.head_dim or grid["head_dims"],
        seqlens=args.seqlen or grid["seqlens"],
        causal=grid["causal"] if args.causal is None else (args.causal == "true",),
        impls=impls or bench.IMPLEMENTATIONS, modes=modes or bench.DEFAULT_MODES,
        batch=args.batch, heads=args.heads)
    if args.out:
        for path in bench.write(result, args.out):
            print(f"flashgen bench: wrote {path}")
    return 0


def _bench_serving(args) -> int:
    from flashgen.tools.bench import serving

    mode = args.mode[0]
    grid = dict(serving.DECODE_GRID if mode == "decode" else serving.PREFILL_GRID)
    for key, value in (("dtypes", args.dtype), ("head_dims", args.head_dim),
                       ("batches", args.batch and [args.batch]),
                       ("cache_lengths", args.seqlen)):
        if value:
            grid[key] = tuple(value)
    result = serving.run(mode, grid)
    if args.out:
        for path in serving.write(result, args.out, "flashgen " + " ".join(sys.argv[1:])):
            print(f"flashgen bench: wrote {path}")
    return 0


def _bench_variants(args) -> int:
    from flashgen.tools.bench import variants

    grid = dict(variants.GRID)
    if args.head_dim:
        grid["head_dims"] = tuple(args.head_dim)
    grid["cases"] = variants.selected_cases(args.case)
    result = variants.run(grid)
    if args.out:
        for path in variants.write(result, args.out, "flashgen " + " ".join(sys.argv[1:])):
            print(f"flashgen bench: wrote {path}")
    return 0


def _bench_argument_problem(args) -> str | None:
    """What is wrong with the bench's arguments, checked before looking for a GPU."""
    from flashgen.tools import bench

    unknown = sorted(set(args.impl or ()) - set(bench.KNOWN_IMPLEMENTATIONS))
    if unknown:
        return f"unknown --impl {unknown}; choose from {list(bench.KNOWN_IMPLEMENTATIONS)}"
    serving = set(args.mode or ()) & {*bench.SERVING_MODES, bench.VARIANTS_MODE}
    if serving and (len(args.mode) > 1 or args.memory or args.overhead or args.impl
                    or args.causal or args.heads):
        return (f"--mode {serving.pop()} runs alone, without --memory, --overhead, --impl, "
                f"--causal or --heads (its grid and peers are fixed; --help says which options "
                f"narrow it)")
    if args.case and args.mode != [bench.VARIANTS_MODE]:
        return "--case narrows --mode variants alone"
    if args.case:
        from flashgen.tools.bench import variants

        try:
            variants.selected_cases(args.case)
        except ValueError as e:
            return str(e).removeprefix("flashgen bench: ")
    if args.memory and set(args.mode or ()) - set(bench.MEMORY_MODES):
        return (f"--memory measures --mode {' and '.join(bench.MEMORY_MODES)} (a backward's peak "
                f"includes what its forward saved)")
    for option, value in (("--batch", args.batch), ("--heads", args.heads)):
        if value is not None and value < 1:
            return f"{option} {value}: must be at least 1"
        if value is not None and (args.memory or args.overhead):
            return f"{option} sets the speed grid's shape; --memory and --overhead use their own"
    return None


def _doctor(args) -> int:
    from flashgen.tools import doctor

    return doctor.run()


def _tune(args) -> int:
    import json

    import torch

    from flashgen.tools import tune

    if not torch.cuda.is_available():
        print("flashgen tune: no CUDA GPU on this machine; tune where the kernels will run",
              file=sys.stderr)
        return 1
    arch = arch_for_capability(*torch.cuda.get_device_capability())
    if args.arch and args.arch != [arch]:
        print(f"flashgen tune: this GPU is {arch}; it can only tune {arch}", file=sys.stderr)
        return 2
    config = load_config(args.config or paths.config_path())
    specs = [KernelSpec(family, kind, arch, dtype, head_dim, mask, tile)
             for family in (args.family or config.families)
             for kind in (args.kind or args.direction or KINDS)
             if kind in tune.GRIDS.get(family, {})  # decode tiles are set by hand
             for head_dim in (args.head_dim or config.head_dims(family, kind, arch))
             for tile in tune.candidate_tiles(family, kind, arch, head_dim)
             for dtype in (args.dtype or config.dtypes)
             for mask in (args.mask or config.masks)]
    print(f"flashgen tune: {len(specs)} candidate kernels for {arch}")
    rows = tune.sweep(specs, seqlen=args.seqlen)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    winners = tune.pick_winners(rows)
    mask_winners = tune.pick_mask_winners(rows)
    text = config.path.read_text()
    for (family, kind, head_dim), tile in sorted(winners.items()):
        print(f"flashgen tune: {family} {arch} {kind} head dim {head_dim}: {tile.suffix}")
        text = tune.set_tile(text, family, kind, arch, head_dim, tile)
        for mask in config.masks:
            own = mask_winners.get((family, kind, head_dim, mask))
            if own is not None and own != tile:
                print(f"flashgen tune: {family} {arch} {kind} head dim {head_dim} {mask}: "
                      f"{own.suffix}")
            text = tune.set_mask_tile(text, family, kind, arch, head_dim, mask, tile, own)
    if args.write and winners:
        candidate = config.path.with_suffix(".tuned.tmp")
        candidate.write_text(text)
        load_config(candidate)  # never write a config that does not load
        candidate.replace(config.path)
        print(f"flashgen tune: wrote {config.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"generate": _generate, "list": _list, "pack": _pack, "bench": _bench,
                "tune": _tune, "doctor": _doctor}[args.command](args)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return 2
    except (ConfigError, build.BuildError, FileNotFoundError, TimeoutError) as e:
        print(str(e), file=sys.stderr)
        return 1
    except BrokenPipeError:  # `flashgen list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
