"""flashgen: exact FlashAttention kernels generated for your head dims, dtypes and GPUs.

    from flashgen import flash_attn_func, scaled_dot_product_attention

Importing the package is cheap; torch is imported when a function is first used.
"""

__version__ = "0.1.0"
__all__ = ["flash_attn_func", "flash_attn_varlen_func", "scaled_dot_product_attention",
           "flash_attn_with_kvcache", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "merge_attention_states", "block_mask", "__version__"]
_PACKED = ("flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func")


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
