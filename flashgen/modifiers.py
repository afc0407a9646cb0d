"""A call's run-time arguments beyond q, k, v, the scale and the band: the score modifier's
(codegen/score_mods.py names the kinds), a config-defined variant's and dropout's."""

from __future__ import annotations

import math
from dataclasses import dataclass

_LOG2_E = math.log2(math.e)


@dataclass(frozen=True, kw_only=True)  # by name: its fields grow
class Modifiers:
    """A call's run-time arguments beyond q, k, v, the scale and the band (params.h): softcap > 0
    caps the scores; alibi_slopes, an fp32 (heads,) or (batch, heads) device tensor, biases them
    (after the cap, where both are given); attn_bias adds to each (alone: flashgen/validate.py
    checks); a
    config-defined variant (codegen/variants.py) with its tensors, contiguous in its table's
    order, and, where it has a mask, the mask's block ranges (common/variant.cuh); dropout_p > 0
    drops probabilities under the Philox key in dropout_seed, a (1,) int64 device tensor
    (common/dropout.cuh); sinks, a contiguous fp32 (heads,) device tensor, joins each row's
    softmax denominator (common/sinks.cuh)."""
    softcap: float = 0.0
    alibi_slopes: object = None
    attn_bias: object = None          # fp32 (batch, heads, seqlen_q, seqlen_k), keys contiguous
    variant: object = None            # a codegen.variants.Variant
    variant_tensors: tuple = ()
    mask_ranges: object = None
    dropout_p: float = 0.0
    dropout_seed: object = None
    sinks: object = None

    @property
    def dropout(self) -> bool:
        """Whether the call runs a kernel with dropout."""
        return self.dropout_p > 0

    @property
    def score_mod(self) -> str:
        """The score modifier kind the call runs."""
        if self.variant is not None and self.variant.score_mod:
            return self.variant.name
        if self.softcap > 0:
            return "softcap" if self.alibi_slopes is None else "softcap_alibi"
        if self.attn_bias is not None:
            return "bias"
        return "none" if self.alibi_slopes is None else "alibi"

    def fields(self, scale: float) -> dict:
        """The params fields of the softmax scale, the score modifier and the variant: the
        softmax runs on exp2 of the (modified) score times scale_log2, which is softmax_scale *
        log2(e), or log2(e) times the softcap (common/score_mod.cuh's Softcap leaves the factor
        to it) or times 1 (a variant's score_mod sees the scaled score)."""
        slopes = self.alibi_slopes
        factor = scale
        if self.softcap > 0:
            factor = self.softcap
        elif self.variant is not None and self.variant.score_mod:
            factor = 1.0
        fields = {"softmax_scale": scale, "scale_log2": factor * _LOG2_E,
                  "softcap": self.softcap,
                  "alibi_slopes": 0 if slopes is None else slopes.data_ptr(),
                  "alibi_batch_stride": 0 if slopes is None or slopes.dim() == 1
                  else slopes.stride(0)}
        if self.attn_bias is not None:
            bias = self.attn_bias
            fields.update(attn_bias=bias.data_ptr(), attn_bias_batch_stride=bias.stride(0),
                          attn_bias_head_stride=bias.stride(1),
                          attn_bias_row_stride=bias.stride(2))
        if self.mask_ranges is not None:
            fields["mask_ranges"] = self.mask_ranges.data_ptr()
        if self.dropout:
            fields.update(dropout_p=self.dropout_p, dropout_seed=self.dropout_seed.data_ptr())
        if self.sinks is not None:
            fields["sinks"] = self.sinks.data_ptr()
        for i, tensor in enumerate(self.variant_tensors):
            fields[f"variant_tensor{i}"] = tensor.data_ptr()
            fields.update({f"variant_size{i}_{d}": size for d, size in enumerate(tensor.shape)})
        return fields


PLAIN = Modifiers()
