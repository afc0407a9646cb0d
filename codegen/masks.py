"""Mask kinds: which keys a query row sees. Each names a C++ policy type in
templates/include/flashgen/common/mask.cuh that forward and backward kernels share; a spec
carries one, so each is a compile-time choice (it decides which key blocks a query block visits).
A call's run-time mask arguments are flashgen/band.py's Band.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MaskKind:
    name: str         # in the config's `masks`, spec names and dispatch
    cpp_type: str     # the policy the templates instantiate
    hides_keys: bool  # some query rows skip some key blocks, so a sequence's blocks do unequal
                      # work (the policy's kHidesKeys; grid order and scheduling differ)


MASKS = {m.name: m for m in (
    MaskKind("none", "flashgen::NoMask", hides_keys=False),
    # Query row i sees key j iff j <= i + offset, the offset per sequence (bottom-right or
    # top-left aligned, chosen by the caller).
    MaskKind("causal", "flashgen::CausalMask", hides_keys=True),
    # Query row i sees key j iff i + offset - left <= j <= i + offset + right, the window at run
    # time (params.h): every sliding (local) window, causal or not, runs on these kernels.
    MaskKind("window", "flashgen::WindowMask", hides_keys=True),
)}
