"""What a kernel family is: the record codegen and dispatch read, so that a new family is a new
file under codegen/families/ plus its templates, not edits across the tree.

A family is one design of attention kernels (the mma family: FlashAttention-2's mma.sync +
cp.async kernels). It runs on some archs, builds some kinds of kernel (fwd, bwd; later split,
combine, append), each kind from its own template with its own tile keys and resource checks, and
ranks against other families in dispatch by its priority.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, ClassVar


@dataclass(frozen=True, order=True)
class Tile:
    """A kind's compile-time tile. Subclasses name their fields after the config table's keys (in
    the table's order) and give each a one-letter SUFFIX for spec names."""
    SUFFIX: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def flags(cls) -> frozenset[str]:
        """The keys that are on/off switches (true/false in the config) rather than sizes."""
        return frozenset(f.name for f in fields(cls) if f.type in (bool, "bool"))

    @property
    def suffix(self) -> str:
        """e.g. m128n64w4s2: every value (a flag as 0 or 1), so that the spec name names the
        tile."""
        return "".join(f"{letter}{int(getattr(self, key))}"
                       for letter, key in zip(self.SUFFIX, self.keys(), strict=True))


@dataclass(frozen=True)
class Kind:
    """One kind of kernel a family builds."""
    name: str                 # "fwd" | "bwd": in spec names and dispatch
    table: str | None         # its subtable of a head-dim table; None: the head-dim table itself
    tile: type[Tile]
    template: str             # relative to the family's template folder
    # (head_dim, tile, arch) -> why the tile cannot be built, one line per reason
    problems: Callable[..., list[str]]
    required: bool = True     # every head dim must configure it
    alt_tiles: bool = False   # may list [[alt_tiles]]: more tiles, chosen per call by shape


@dataclass(frozen=True)
class Family:
    name: str                 # the config's top-level table and the spec names' second word
    archs: tuple[str, ...]    # the arch tables it accepts (codegen/arch.py)
    priority: int             # dispatch tries families in ascending priority
    kinds: tuple[Kind, ...]
    template_dir: Path        # its Jinja templates
    # spec -> extra template variables derived from the tile (compile-time choices)
    template_context: Callable[..., dict] = lambda spec: {}
    # arch -> nvcc's -gencode flag (a family may need the arch-specific target, e.g. sm_90a)
    gencode: Callable[..., str] = lambda arch: arch.gencode
    # nvcc flags of this family's kernels alone
    nvcc_flags: tuple[str, ...] = ()
    # Its kernels read q, k and v through TMA descriptors, which take no zero strides: the
    # forward copies expanded inputs first (flashgen/host.py).
    tma_inputs: bool = False
    # Under a mask that hides keys its forward's blocks claim tiles from a counter
    # (FwdParams.tile_counter), which the forward allocates per call.
    tile_counter: bool = False
    # Its forward reads a variable-length batch (FwdParams.cu_seqlens_q, common/seqinfo.cuh).
    varlen_forward: bool = False
    # Its backward takes a variable-length batch (dispatch passes such calls to a family that
    # does).
    varlen_backward: bool = False
    # Its backward writes the bias score modifier's gradient (BwdParams.attn_bias_grad): SDPA's
    # additive attn_mask that requires grad.
    bias_gradient: bool = False
    # The kinds whose kernels take dropout on the probabilities (common/dropout.cuh): with the
    # config's `dropout`, each built-in kernel of those kinds gets a twin that applies it.
    dropout_kinds: tuple[str, ...] = ()
    # Its forward reads a KV cache (FwdParams' cache fields), contiguous or paged with pages of
    # whole key blocks: chunked prefill can run on it (flashgen/decode.py).
    cache_forward: bool = False

    def kind(self, name: str) -> Kind:
        for kind in self.kinds:
            if kind.name == name:
                return kind
        raise KeyError(f"family {self.name} has no kind {name!r}")

    @property
    def subtables(self) -> tuple[str, ...]:
        return tuple(k.table for k in self.kinds if k.table is not None)
