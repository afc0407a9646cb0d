"""flashgen: exact FlashAttention kernels generated for your head dims, dtypes and GPUs.

    from flashgen import flash_attn_func

FlashAttention-2's functions: flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
flash_attn_qkvpacked_func, flash_attn_kvpacked_func, flash_attn_varlen_qkvpacked_func and
flash_attn_varlen_kvpacked_func; scaled_dot_product_attention (PyTorch's, as a drop-in);
merge_attention_states (combine partial attention by lse); block_mask (a config-defined mask's
key blocks, computed once). flashgen.compat serves code that imports flash_attn. Importing the
package is cheap; torch is imported when a function is first used. docs/usage.md has the rest.
"""

__version__ = "0.1.0"
__all__ = ["flash_attn_func", "flash_attn_varlen_func", "scaled_dot_product_attention",
           "flash_attn_with_kvcache", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "merge_attention_states", "block_mask", "__version__"]
_PACKED = ("flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func")


def __dir__():
    return sorted({*globals(), *__all__})


def __getattr__(name):
    if name in ("flash_attn_func", "flash_attn_varlen_func", "scaled_dot_product_attention"):
        from flashgen import attention

        return getattr(attention, name)
    if name == "flash_attn_with_kvcache":
        from flashgen import kvcache

        return kvcache.flash_attn_with_kvcache
    if name in _PACKED:
        from flashgen import packed

        return getattr(packed, name)
    if name == "block_mask":
        from flashgen import variant_args

        return variant_args.block_mask
    if name == "merge_attention_states":
        from flashgen import merge

        return merge.merge_attention_states
    raise AttributeError(f"module 'flashgen' has no attribute {name!r}")
