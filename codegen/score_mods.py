"""Score modifier kinds: a function of each score applied before the softmax (and its gradient in
the backward). Each names a C++ policy type in templates/include/flashgen/common/score_mod.cuh
that forward and backward kernels share; a spec carries one, so each is a compile-time choice (a
kernel without one carries no code for it). The config's `score_mods` lists those built: each
beyond "none" adds one kernel per (family, forward or backward, arch, dtype, head dim, mask,
tile), doubling those kinds' part of the build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreModKind:
    name: str                # in the config's `score_mods`, spec names and dispatch
    cpp_type: str            # the policy the templates instantiate
    kinds: tuple[str, ...]   # the kernel kinds that take it


SCORE_MODS = {m.name: m for m in (
    ScoreModKind("none", "flashgen::IdentityScore", ("fwd", "bwd", "decode")),
    # softcap * tanh(s * softmax_scale / softcap) (Gemma-2, Grok), the cap at run time
    # (params.h's softcap).
    ScoreModKind("softcap", "flashgen::Softcap", ("fwd", "bwd")),
)}


_LOG2_E = math.log2(math.e)


def score_mod_of(softcap: float) -> str:
    """The score modifier kind a call runs: "softcap" for a cap above 0, else "none"."""
    return "softcap" if softcap > 0 else "none"


def score_fields(scale: float, softcap: float = 0.0) -> dict:
    """The params fields of the softmax scale and the score modifier: the softmax runs on exp2 of
    the (modified) score times scale_log2, which is softmax_scale * log2(e), or under a softcap
    softcap * log2(e) (common/score_mod.cuh's Softcap leaves the factor to it)."""
    return {"softmax_scale": scale, "scale_log2": (softcap if softcap > 0 else scale) * _LOG2_E,
            "softcap": softcap}
