"""flashgen inside other libraries; each module imports its library only when imported itself.

- flashgen.integrations.transformers: register() makes attn_implementation="flashgen" an
  attention implementation of Hugging Face transformers.
- flashgen.integrations.sdpa: importing it registers "flashgen" with PyTorch's flash-attention
  registry (torch.nn.attention.activate_flash_attention_impl("flashgen"), or enable()), which
  runs SDPA's FLASH_ATTENTION backend on flashgen's kernels.
"""
