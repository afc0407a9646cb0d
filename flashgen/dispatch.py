"""Which kernel runs a call: a pure function of the configured specs and the call's properties."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codegen.spec import KernelSpec


class DispatchError(ValueError):
    """No configured kernel can run this call; the message says how to add one."""


_EXAMPLE_TILES = {"fwd": "block_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2",
                  "bwd": "block_m = 64\nblock_n = 64\nwarps = 8\nq_stages = 2"}


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


def select(specs: tuple[KernelSpec, ...], arch: str, dtype: str, head_dim: int, causal: bool,
           config_path: Path | str = "the config", direction: str = "fwd") -> Choice:
    """The spec for this call: the exact head dim if configured, else the next larger one.
    specs: the main tiles' specs (enumerate_specs(..., variants=False)), one per direction, arch,
    dtype, head dim and causality."""
    arch_specs = [s for s in specs if s.arch == arch and s.direction == direction]
    what = "forward" if direction == "fwd" else "backward"
    table = "" if direction == "fwd" else ".backward"
    if not arch_specs:
        archs = sorted({s.arch for s in specs if s.direction == direction})
        raise DispatchError(
            f"flashgen has no {what} kernels for this GPU's arch {arch}: {config_path} configures "
            f"{', '.join(archs) or 'none'}. Add [arch.{arch}.head_dim.N{table}] tables to the config "
            f"(shared-memory limits differ per arch) and run `flashgen generate --arch {arch}`.")
    candidates = sorted((s for s in arch_specs if s.dtype == dtype and s.causal == causal),
                        key=lambda s: s.head_dim)
    if not candidates:
        raise DispatchError(f"flashgen: {config_path} builds no {dtype} "
                            f"{'causal' if causal else 'non-causal'} {what} kernels for {arch}")
    for spec in candidates:
        if spec.head_dim == head_dim:
            return Choice(spec, pad_head_dim=False)
    larger = [s for s in candidates if s.head_dim > head_dim]
    if larger:
        return Choice(larger[0], pad_head_dim=True)
    configured = sorted({s.head_dim for s in candidates})
    hint = (f"the largest head dim flashgen supports is 256"
            if head_dim > 256 else
            f"to add it, put this table in {config_path} and run "
            f"`flashgen generate --arch {arch}`:\n"
            f"[arch.{arch}.head_dim.{head_dim}{table}]\n{_EXAMPLE_TILES[direction]}")
    raise DispatchError(f"flashgen: head_dim {head_dim} is not supported by the {what} on {arch}; "
                        f"configured head dims: {configured}; {hint}")
