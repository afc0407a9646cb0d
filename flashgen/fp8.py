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


def key_of_slot(slot):
    """The key whose V row V^T's column `slot` holds: fragments.cuh's fp8_key_of_slot (thread q
    of a quad holds keys 2q, 2q + 1, 2q + 8, 2q + 9 of each 16, in PV's k slots 4q .. 4q + 3).
    An int, or elementwise over an integer tensor."""
    quad_thread, a, b = slot % 16 // 4, slot % 4 // 2, slot % 2
    return slot // 16 * 16 + 2 * quad_thread + b + 8 * a


def transposed_v(v: torch.Tensor) -> torch.Tensor:
    """v (batch, seqlen_k, heads_kv, head_dim) -> V^T (batch, heads_kv, head_dim, keys),
    contiguous, keys seqlen_k padded with zeros to a multiple of KEY_GROUP, column `slot`
    holding key key_of_slot(slot). Moved as bytes: every torch op takes uint8."""
    batch, seqlen_k, heads_kv, head_dim = v.shape
    keys = -(-seqlen_k // KEY_GROUP) * KEY_GROUP
    v = v.view(torch.uint8)
    if keys != seqlen_k:
        padded = v.new_zeros(batch, keys, heads_kv, head_dim)
        padded[:, :seqlen_k] = v
        v = padded
    # key 16 g + 8 a + 2 q + b -> slot 16 g + 4 q + 2 a + b
    groups = v.reshape(batch, keys // KEY_GROUP, 2, 4, 2, heads_kv, head_dim)
    vt = groups.permute(0, 5, 6, 1, 3, 2, 4).contiguous().view(batch, heads_kv, head_dim, keys)
    return vt.view(E4M3)


def transposed_v_packed(v: torch.Tensor, cu_seqlens_k: torch.Tensor) -> torch.Tensor:
    """A packed batch's v (total_k, heads_kv, head_dim) -> V^T (1, heads_kv, head_dim, columns):
    sequence b's keys from column 16 * ceil(cu_seqlens_k[b] / 16) + 16 * b, each group of 16 of
    them permuted as transposed_v's, zeros elsewhere (fwd_kernel.cuh's vt_first_column);
    columns = total_k rounded up to 16, plus 16 per sequence. Read on the device only (no host
    sync: CUDA graphs capture it)."""
    total, heads_kv, head_dim = v.shape
    batch = cu_seqlens_k.numel() - 1
    columns = -(-total // KEY_GROUP) * KEY_GROUP + KEY_GROUP * batch
    starts = cu_seqlens_k[:-1].long()
    lengths = cu_seqlens_k[1:].long() - starts
    sequence = torch.arange(batch, device=v.device)
    firsts = (starts + KEY_GROUP - 1) // KEY_GROUP * KEY_GROUP + KEY_GROUP * sequence
    column = torch.arange(columns, device=v.device)
    owner = (torch.searchsorted(firsts, column, right=True) - 1).clamp_min(0)
    key = key_of_slot(column - firsts[owner])
    holds = (key >= 0) & (key < lengths[owner])
    source = (starts[owner] + key).clamp(0, max(total - 1, 0))
    rows = v.view(torch.uint8).reshape(total, heads_kv * head_dim)
    gathered = rows.index_select(0, source) * holds.unsqueeze(1).to(torch.uint8)
    return gathered.t().contiguous().view(1, heads_kv, head_dim, columns).view(E4M3)


def wanted(q, k, v, descales: tuple, out_dtype) -> bool:
    """Whether a flash_attn_func call asks for the e4m3 forward: 8-bit inputs, descales or an
    out_dtype."""
    return (any(isinstance(t, torch.Tensor) and t.dtype in EIGHT_BIT for t in (q, k, v))
            or any(d is not None for d in descales) or out_dtype is not None)


def attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
              descales=(None, None, None), out_dtype=None, **others):
    """flash_attn_func's e4m3 call on q (batch, seqlen_q, heads, head_dim), k, v (batch,
    seqlen_k, heads_kv, head_dim): out in out_dtype (bf16 by default) and lse (batch, heads,
    seqlen_q) fp32. descales: q_descale, k_descale, v_descale. others: the arguments this
    forward does not take, name -> (value, the value it takes)."""
    _check(q, k, v, others)
    batch, seqlen_q = q.shape[:2]
    mask, band = _mask(causal, window_size, seqlen_q, k.shape[1])
    return _attention(q, k, v, softmax_scale, mask, band, descales, out_dtype, batch)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale=None, causal=False, window_size=(-1, -1),
                     descales=(None, None, None), out_dtype=None, **others):
    """flash_attn_varlen_func's e4m3 call on packed q (total_q, heads, head_dim), k, v (total_k,
    heads_kv, head_dim): out (total_q, heads, head_dim) and lse (heads, total_q), as
    attention's."""
    validate.check_tensors(("q", "k", "v"), q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"flashgen: {name} must be (total, nheads, headdim), the sequences "
                             f"packed, got shape {tuple(t.shape)}")
    q4, k4, v4 = (t.unsqueeze(0) for t in (q, k, v))
    _check(q4, k4, v4, others)
    validate.check_sequences(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    batch = cu_seqlens_q.shape[0] - 1
    mask, band = _mask(causal, window_size, max_seqlen_q, max_seqlen_k)
    sequences = (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), batch, max_seqlen_q,
                 max_seqlen_k, 0)
    out, lse = _attention(q4, k4, v4, softmax_scale, mask, band, descales, out_dtype, batch,
                          (sequences, cu_seqlens_k))
    return out[0], lse


def _mask(causal: bool, window_size, seqlen_q: int, seqlen_k: int):
    """The mask kind and band, each sequence's aligned bottom-right (of a packed batch: the
    longest lengths decide which bounds hide nothing)."""
    window_size = (-1, -1) if window_size is None else tuple(window_size)
    if window_size == (-1, -1):
        return ("causal" if causal else "none"), Band(seqlen_k - seqlen_q)
    return validate.band(causal, window_size, seqlen_q, seqlen_k, seqlen_k - seqlen_q)


def _attention(q, k, v, softmax_scale, mask: str, band: Band, descales: tuple, out_dtype,
               batch: int, packed: tuple | None = None):
    """(out, lse) on checked (batch, seq, heads, dim) views; packed: a variable-length batch's
    (forward.run's sequences, cu_seqlens_k), its views (1, total, heads, dim)."""
    out_name = _output_dtype(out_dtype)
    _, rows, heads, head_dim = q.shape
    heads_kv = k.shape[2]
    scale = validate.check_scale(softmax_scale, head_dim)
    fields = {}
    for name, factors in zip(DESCALES, descales):
        fields.update(_descale_fields(name, factors, batch, heads_kv, q.device))
    out = torch.empty(q.shape, dtype=out_dtype or torch.bfloat16, device=q.device)
    lse_shape = (batch, heads, rows) if packed is None else (heads, rows)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if out.numel() and k.shape[1] == 0:  # no key: every row's output 0 and lse -inf
        out.zero_()
        lse.fill_(float("-inf"))
    elif out.numel():
        _run(q, k, v, out, lse, scale, mask, band, fields, out_name, packed)
    return out, lse


def _run(q, k, v, out, lse, scale: float, mask: str, band: Band, fields: dict, out_name: str,
         packed: tuple | None):
    head_dim = q.shape[-1]
    arch = arch_for_capability(*torch.cuda.get_device_capability(q.get_device()))
    choice = registry.candidates(arch, KIND, out_name, head_dim, mask)[0]
    padded = choice.padded_head_dim
    run(choice.spec, q, k, v, out, lse, scale, band, fields, packed, padded)


def run(spec, q, k, v, out, lse, scale: float, band: Band, fields: dict | None = None,
        packed: tuple | None = None, padded: int | None = None):
    """Runs the fwd_fp8 kernel `spec` on checked (batch, seq, heads, dim) e4m3 views into out
    and lse (`flashgen tune` times candidates through it); padded: the head dim spec's kernel
    reads, the inputs' zero-padded to it."""
    head_dim = q.shape[-1]
    if padded is not None:  # zeros add nothing to q.k, and V's columns past head_dim are cut
        q, k, v = (_zero_padded(t, padded) for t in (q, k, v))
        work = out.new_empty(*out.shape[:3], padded)
    else:
        work = out
    q, k = _tma_ready(q), _tma_ready(k)
    if packed is None:
        vt, sequences = transposed_v(v), None
    else:
        (sequences, cu_seqlens_k) = packed
        vt = transposed_v_packed(v[0], cu_seqlens_k)
    # V^T as a (batch, head dim, heads, keys) view: the params' batch, row and head strides are
    # its batch's, head dim's and head's (params.h's q_descale).
    forward.run(loader.launcher(spec), q, k, vt.permute(0, 2, 1, 3), work, lse, scale, band,
                fields or {}, sequences)
    if work is not out:
        out.copy_(work[..., :head_dim])


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
