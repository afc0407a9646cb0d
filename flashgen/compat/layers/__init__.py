"""flash_attn.layers: the rotary embedding FlashAttention-2's tests use as their reference."""
