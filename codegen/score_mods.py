"""Score modifier kinds: a function of each score applied before the softmax (and its gradient in
the backward). Each names a C++ policy type in templates/include/flashgen/common/score_mod.cuh
that forward and backward kernels share; a spec carries one, so each is a compile-time choice (a
kernel without one carries no code for it). The config's `score_mods` lists those built: each
beyond "none" adds one kernel per (family, forward or backward, arch, dtype, head dim, mask,
tile), doubling those kinds' part of the build. A call's run-time score modifier arguments are
flashgen/modifiers.py's Modifiers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreModKind:
    name: str                # in the config's `score_mods`, spec names and dispatch
    cpp_type: str            # the policy the templates instantiate
    kinds: tuple[str, ...]   # the kernel kinds that take it


SCORE_MODS = {m.name: m for m in (
    ScoreModKind("none", "flashgen::IdentityScore", ("fwd", "bwd", "kvcache", "fwd_fp8")),
    # softcap * tanh(s * softmax_scale / softcap) (Gemma-2, Grok), the cap at run time
    # (params.h's softcap).
    ScoreModKind("softcap", "flashgen::Softcap", ("fwd", "bwd", "kvcache")),
    # ALiBi, the slopes at run time (params.h's alibi_slopes).
    ScoreModKind("alibi", "flashgen::Alibi", ("fwd", "bwd", "kvcache")),
    # softcap, then ALiBi (FlashAttention-2 takes both at once), both at run time.
    ScoreModKind("softcap_alibi", "flashgen::SoftcapAlibi", ("fwd", "bwd", "kvcache")),
    # An additive bias per score (SDPA's attn_mask), the tensor at run time (params.h's
    # attn_bias).
    ScoreModKind("bias", "flashgen::ScoreBias", ("fwd", "bwd")),
)}
