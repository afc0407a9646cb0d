"""The e4m3 forward: flash_attn_func with q, k and v in torch.float8_e4m3fn and
FlashAttention-3's descale factors, on the hopper family's fwd_fp8 kernels (sm_90a; a head dim's
`fp8` table in the config builds them, codegen/families/hopper/).

An 8-bit wgmma takes both operands K-major, so PV's B operand is V^T with the keys contiguous:
transposed_v makes it before the launch, one pass over V (an attention of seqlen N reads each V
byte about N / 64 times, so the pass costs under 1% from 4k keys). P stays in the registers its
scores were computed in, so V^T's keys are permuted within each 16 as those registers hold them
(key_of_slot, fragments.cuh's fp8_key_of_slot). The output is bf16 (fp16 with out_dtype), lse
fp32; forward only.
"""

from __future__ import annotations

import torch

from codegen.arch import arch_for_capability
from flashgen import forward, loader, registry, validate
from flashgen.band import Band

KIND = "fwd_fp8"
E4M3 = torch.float8_e4m3fn
EIGHT_BIT = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
             torch.float8_e5m2fnuz)
OUTPUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# V^T's keys are permuted within groups of this many, and padded to a whole group.
KEY_GROUP = 16
DESCALES = ("q_descale", "k_descale", "v_descale")


def key_of_slot(slot: int) -> int:
    """The key whose V row V^T's column `slot` holds: fragments.cuh's fp8_key_of_slot (thread q
    of a quad holds keys 2q, 2q + 1, 2q + 8, 2q + 9 of each 16, in PV's k slots 4q .. 4q + 3)."""
    quad_thread, a, b = slot % 16 // 4, slot % 4 // 2, slot % 2
    return slot // 16 * 16 + 2 * quad_thread + b + 8 * a


def transposed_v(v: torch.Tensor) -> torch.Tensor:
    """v (batch, seqlen_k, heads_kv, head_dim) -> V^T (batch, heads_kv, head_dim, keys),
    contiguous, keys seqlen_k padded with zeros to a multiple of KEY_GROUP, column `slot`
    holding key key_of_slot(slot)."""
    batch, seqlen_k, heads_kv, head_dim = v.shape
    keys = -(-seqlen_k // KEY_GROUP) * KEY_GROUP
    if keys != seqlen_k:
        padded = v.new_zeros(batch, keys, heads_kv, head_dim)
        padded[:, :seqlen_k] = v
        v = padded
    # key 16 g + 8 a + 2 q + b -> slot 16 g + 4 q + 2 a + b
    groups = v.reshape(batch, keys // KEY_GROUP, 2, 4, 2, heads_kv, head_dim)
    return groups.permute(0, 5, 6, 1, 3, 2, 4).reshape(batch, heads_kv, head_dim, keys)


def wanted(q, k, v, descales: tuple, out_dtype) -> bool:
    """Whether a flash_attn_func call asks for the e4m3 forward: 8-bit inputs, descales or an
    out_dtype."""
    return (any(isinstance(t, torch.Tensor) and t.dtype in EIGHT_BIT for t in (q, k, v))
            or any(d is not None for d in descales) or out_dtype is not None)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                    q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
                    return_attn_probs=False, **others):
    """flash_attn_func's e4m3 call: out (batch, seqlen_q, heads, head_dim) in out_dtype (bf16 by
    default), or with return_attn_probs (out, softmax_lse, None). others: the arguments this
    forward does not take, name -> (value, the value it takes)."""
    _check(q, k, v, others)
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    out_name = _output_dtype(out_dtype)
    scale = validate.check_scale(softmax_scale, head_dim)
    window_size = (-1, -1) if window_size is None else tuple(window_size)
    if window_size == (-1, -1):
        mask, band = ("causal" if causal else "none"), Band(seqlen_k - seqlen_q)
    else:
        mask, band = validate.band(causal, window_size, seqlen_q, seqlen_k, seqlen_k - seqlen_q)
    fields = {}
    for name, factors in zip(DESCALES, (q_descale, k_descale, v_descale)):
        fields.update(_descale_fields(name, factors, batch, heads_kv, q.device))
    out_dtype = out_dtype or torch.bfloat16
    out = torch.empty(batch, seqlen_q, heads, head_dim, dtype=out_dtype, device=q.device)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    if out.numel() and seqlen_k == 0:  # no key: every row's output 0 and lse -inf
        out.zero_()
        lse.fill_(float("-inf"))
    elif out.numel():
        out, lse = _run(q, k, v, out, lse, scale, mask, band, fields, out_name)
    return (out, lse, None) if return_attn_probs else out


def _run(q, k, v, out, lse, scale: float, mask: str, band: Band, fields: dict, out_name: str):
    head_dim = q.shape[-1]
    arch = arch_for_capability(*torch.cuda.get_device_capability(q.get_device()))
    choice = registry.candidates(arch, KIND, out_name, head_dim, mask)[0]
    padded = choice.padded_head_dim
    if padded is not None:  # zeros add nothing to q.k, and V's columns past head_dim are cut
        q, k, v = (_zero_padded(t, padded) for t in (q, k, v))
        work = out.new_empty(*out.shape[:3], padded)
    else:
        work = out
    q, k = _tma_ready(q), _tma_ready(k)
    vt = transposed_v(v)
    # V^T as a (batch, head dim, heads, keys) view: the params' batch, row and head strides are
    # its batch's, head dim's and head's (params.h's q_descale).
    forward.run(loader.launcher(choice.spec), q, k, vt.permute(0, 2, 1, 3), work, lse, scale,
                band, fields)
    if work is not out:
        out.copy_(work[..., :head_dim])
    return out, lse


def _check(q, k, v, others: dict) -> None:
    names = ("q", "k", "v")
    validate.check_tensors(names, q, k, v)
    for name, t in zip(names, (q, k, v)):
        if t.dtype in EIGHT_BIT and t.dtype != E4M3:
            raise TypeError(f"flashgen: {name} is {t.dtype}; the 8-bit forward is built for "
                            f"torch.float8_e4m3fn only (q, k and v alike)")
    for name, t in zip(names, (q, k, v)):
        if t.dtype != E4M3:
            raise TypeError(f"flashgen: the 8-bit forward takes q, k and v in "
                            f"torch.float8_e4m3fn, got {name} in {t.dtype} (descales and "
                            f"out_dtype are its arguments alone)")
    for name, (value, taken) in others.items():
        if value is not taken and value != taken:
            raise NotImplementedError(f"flashgen: the float8_e4m3fn forward does not take "
                                      f"{name}={value!r} (only {name}={taken!r})")
    validate.check_on_one_cuda_device(names, q, k, v)
    capability = torch.cuda.get_device_capability(q.device)
    if capability < (8, 9):
        raise RuntimeError(f"flashgen: this GPU (compute capability {capability[0]}."
                           f"{capability[1]}) has no FP8 tensor cores; the float8_e4m3fn "
                           f"forward runs on Hopper (sm_90)")
    validate.check_rank_4_head_dim_contiguous(names, q, k, v)
    validate.check_shapes(names, q, k, v, "(batch, seqlen, nheads, headdim)")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("flashgen: the float8_e4m3fn forward has no backward: call it under "
                           "torch.no_grad() or with inputs that need no gradient (train in "
                           "bf16 or fp16)")


def _output_dtype(out_dtype) -> str:
    if out_dtype is None:
        return OUTPUT_DTYPES[torch.bfloat16]
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"flashgen: out_dtype={out_dtype!r}: the float8_e4m3fn forward writes "
                        f"torch.bfloat16 (the default) or torch.float16")
    return OUTPUT_DTYPES[out_dtype]


def _descale_fields(name: str, factors, batch: int, heads_kv: int, device) -> dict:
    """The params fields of one of q_descale, k_descale, v_descale: fp32 factors of any shape
    that broadcasts to (batch, heads_kv) (a scalar tensor: one per tensor)."""
    if factors is None:
        return {}
    if not isinstance(factors, torch.Tensor):
        raise TypeError(f"flashgen: {name} must be a torch.Tensor of fp32 factors, (batch, "
                        f"nheads_k), got {type(factors).__name__}")
    if factors.dtype != torch.float32:
        raise TypeError(f"flashgen: {name} must be torch.float32, got {factors.dtype}")
    if factors.device != device:
        raise ValueError(f"flashgen: {name} is on {factors.device}, q on {device}")
    try:
        view = factors.expand(batch, heads_kv)
    except RuntimeError:
        raise ValueError(f"flashgen: {name} must be (batch, nheads_k) = ({batch}, {heads_kv}) "
                         f"or broadcast to it, got shape {tuple(factors.shape)}") from None
    return {name: view.data_ptr(), f"{name}_batch_stride": view.stride(0),
            f"{name}_head_stride": view.stride(1)}


def _zero_padded(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    padded = t.new_zeros(*t.shape[:3], head_dim)
    padded[..., :t.shape[-1]] = t
    return padded


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy where a TMA descriptor cannot read it: its address and every
    stride a multiple of 16 bytes (16 one-byte elements) and nonzero."""
    strides = t.stride()[:3]
    if t.data_ptr() % 16 or any(s == 0 or s % 16 for s in strides):
        return t.contiguous()
    return t
