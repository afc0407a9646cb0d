"""Which kernels can run a call: a pure function of the configured specs and the call's
properties, returning candidates in an explicit order (family priority, then tile)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codegen import families
from codegen.arch import ARCHS
from codegen.spec import KernelSpec


class DispatchError(ValueError):
    """No configured kernel can run this call; the message says how to add one."""


_KIND_WORDS = {"fwd": "forward", "bwd": "backward", "kvcache": "KV-cache",
               "fwd_fp8": "float8_e4m3fn forward"}


@dataclass(frozen=True)
class Choice:
    spec: KernelSpec
    # The call's head dim is zero-padded up to spec.head_dim (exact: zeros add nothing to q.k
    # and the padded output columns are dropped).
    pad_head_dim: bool

    @property
    def padded_head_dim(self) -> int | None:
        """The head dim the call is zero-padded to; None when it runs at its own."""
        return self.spec.head_dim if self.pad_head_dim else None


def candidates(specs: tuple[KernelSpec, ...], arch: str, kind: str, dtype: str, head_dim: int,
               mask: str, config_path: Path | str = "the config",
               family: str | None = None, score_mod: str = "none",
               dropout: bool = False) -> tuple[Choice, ...]:
    """Every spec that can run this call, best first: each family's kernels of the smallest
    configured head dim that fits (the call's own, else the next larger one: zero-padded), the
    families with the least padding first and among those by priority; in each family the head
    dim's tiles in the config's order, the main tile first. specs: every configured spec, each (family, kind, arch,
    dtype, head dim, mask, score modifier)'s tiles in the config's order. family: only that
    family's (None: all). dropout: kernels that apply it (codegen/spec.py), or those that do not.
    Raises DispatchError, saying how to configure one, when there is none."""
    arch_specs = [s for s in specs if s.arch == arch and s.kind == kind
                  and (family is None or s.family == family)]
    what = _KIND_WORDS.get(kind, kind)
    which = f"{family} " if family else ""
    if not arch_specs:
        archs = sorted({s.arch for s in specs if s.kind == kind})
        raise DispatchError(
            f"flashgen has no {which}{what} kernels for this GPU's arch {arch}: {config_path} "
            f"configures {', '.join(archs) or 'none'}. Add [<family>.{arch}.head_dim.N] tables to "
            f"the config (e.g. [mma.{arch}.head_dim.128]; shared-memory limits differ per arch) "
            f"and run `flashgen generate --arch {arch}`.")
    matching = [s for s in arch_specs if s.dtype == dtype and s.mask == mask
                and s.score_mod == score_mod and s.dropout == dropout]
    if dropout and not matching:
        takers = sorted(name for name, f in families.FAMILIES.items() if kind in f.dropout_kinds)
        raise DispatchError(
            f"flashgen: {config_path} builds no {dtype} {which}{what} kernels with dropout for "
            f"mask {mask!r} and score modifier {score_mod!r} on {arch}: dropout runs on the "
            f"{' and '.join(takers) or 'no'} family's kernels built with it; set dropout = true "
            f"at the config's top level (built-in masks and score modifiers) or in a "
            f"[variants.<name>] table (that variant), then run `flashgen generate`")
    if not matching and score_mod != "none" and any(s.score_mod == score_mod for s in specs):
        raise DispatchError(f"flashgen: {config_path} builds no {dtype} {which}{what} kernels "
                            f"with mask {mask!r} and score modifier {score_mod!r} for {arch}")
    if not matching and score_mod != "none":
        raise DispatchError(
            f"flashgen: {config_path} builds no {what} kernels with score modifier "
            f"{score_mod!r}: add it to the config's score_mods (e.g. score_mods = [\"none\", "
            f"\"{score_mod}\"]) and run `flashgen generate --arch {arch}`")
    if not matching:
        raise DispatchError(f"flashgen: {config_path} builds no {dtype} {which}{what} kernels "
                            f"with mask {mask!r} for {arch}")
    # Each family's smallest fitting head dim; the least padding first (padding is work), then
    # family priority.
    ranked = []
    for name in {s.family for s in matching}:
        of_family = [s for s in matching if s.family == name]
        fitting = min((s.head_dim for s in of_family if s.head_dim >= head_dim), default=None)
        if fitting is not None:
            ranked.append(((fitting, families.FAMILIES[name].priority, name),
                           [s for s in of_family if s.head_dim == fitting]))
    chosen = [Choice(s, pad_head_dim=s.head_dim != head_dim)
              for _, of_family in sorted(ranked, key=lambda r: r[0]) for s in of_family]
    if chosen:
        return tuple(chosen)
    configured = sorted({s.head_dim for s in matching})
    example = _example_table(_buildable_like(matching, arch, head_dim), arch, head_dim)
    hint = ("the largest head dim flashgen supports is 256" if head_dim > 256 else
            f"to add it, put this table in {config_path} and run "
            f"`flashgen generate --arch {arch}`:\n{example}")
    raise DispatchError(f"flashgen: head_dim {head_dim} is not supported by the {what} on {arch}; "
                        f"configured head dims: {configured}; {hint}")


def _buildable_like(specs: list[KernelSpec], arch: str, head_dim: int) -> KernelSpec:
    """The first of the specs whose tile could be built at head_dim, else one of the most general
    family (the last in priority): a family's tiles may not fit a larger head dim at all (the
    hopper backward's registers)."""
    for spec in specs:
        kind = spec.family_record.kind(spec.kind)
        if not kind.problems(head_dim, spec.tile, ARCHS[arch]):
            return spec
    return max(specs, key=lambda s: families.FAMILIES[s.family].priority)


def _example_table(spec: KernelSpec, arch: str, head_dim: int) -> str:
    """A table configuring head_dim like the configured `spec` (its family, kind and tile)."""
    kind = spec.family_record.kind(spec.kind)
    table = f"[{spec.family}.{arch}.head_dim.{head_dim}{'.' + kind.table if kind.table else ''}]"
    return "\n".join([table, *(f"{key} = {getattr(spec.tile, key)}" for key in spec.tile.keys())])
