"""What a spec's template is rendered with, as plain data: the template file and the variables
beside `spec` itself. No Jinja here: the runtime's cache key (flashgen/cache.py) covers every
input of a render without rendering, and codegen/render.py renders exactly these."""

from __future__ import annotations

from pathlib import Path

from codegen.spec import KernelSpec

ELEMENT_TYPES = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
# The inputs' element of the kinds whose inputs are not of the spec's dtype (the output's).
INPUT_ELEMENT_TYPES = {"fwd_fp8": "cutlass::float_e4m3_t"}


def template(spec: KernelSpec) -> tuple[Path, str]:
    """The spec's family's template folder (the Jinja loader's root) and its kind's template's
    name in it."""
    family = spec.family_record
    return family.template_dir, family.kind(spec.kind).template


def variables(spec: KernelSpec) -> dict:
    """The template's variables beside `spec`: C++ type names, a config-defined variant's code
    and the family's compile-time choices derived from the tile (plain str, bool and int)."""
    return {"element_type": ELEMENT_TYPES[spec.dtype],
            "input_element_type": INPUT_ELEMENT_TYPES.get(spec.kind, ELEMENT_TYPES[spec.dtype]),
            "mask_type": spec.mask_kind.cpp_type,
            "score_mod_type": spec.score_mod_kind.cpp_type, "dropout_type": spec.dropout_type,
            **_variant_code(spec), **spec.family_record.template_context(spec)}


def _variant_code(spec: KernelSpec) -> dict:
    """A config-defined variant's struct (after the launch header) and, for its mask, the entry
    that fills the mask's block ranges (common/variant.cuh), which the binding calls as
    `attention`."""
    variant = spec.variant
    if variant is None:
        return {"variant_code": "", "variant_entry": ""}
    entry = ""
    if spec.computes_mask_ranges:
        entry = (
            "\n// The variant's mask ranges (common/variant.cuh), before its kernels run.\n"
            "extern \"C\" int flashgen_mask_ranges(const flashgen::AttentionParams* params, "
            "void* stream) {\n"
            f"  return int(flashgen::compute_mask_ranges<{variant.struct}>(*params, "
            "static_cast<cudaStream_t>(stream)));\n}\n")
    return {"variant_code": '#include "flashgen/common/variant.cuh"\n\n' + variant.cpp(),
            "variant_entry": entry}
