"""Argument checks of the public functions: a clear exception before any kernel launch."""

from __future__ import annotations

import dataclasses
import math
import os

import torch

from codegen.params import WINDOW_UNBOUNDED
from flashgen.band import Band
from flashgen.modifiers import PLAIN, Modifiers

SUPPORTED_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def debug_checks() -> bool:
    """FLASHGEN_DEBUG_CHECKS=1: also check argument values that live on the device (read back
    with a sync, so not inside CUDA graphs or torch.compile)."""
    return os.environ.get("FLASHGEN_DEBUG_CHECKS") == "1"


def check_unsupported(**arguments) -> None:
    """Arguments flashgen does not implement yet, given as name=(value, default)."""
    for name, (value, default) in arguments.items():
        if value is not default and value != default:
            raise NotImplementedError(
                f"flashgen: {name}={value!r} is not supported yet (only {name}={default!r})")


def check_qkv(names: tuple[str, str, str], q, k, v) -> str:
    """q, k, v: CUDA tensors of one supported dtype on one device, rank 4, head dim contiguous.
    Returns the dtype's short name."""
    check_tensors(names, q, k, v)
    check_on_one_cuda_device(names, q, k, v)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"flashgen: {names[0]}, {names[1]}, {names[2]} must have one dtype, got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"flashgen: {q.dtype} inputs run in flash_attn_func and "
                        f"flash_attn_varlen_func alone (their float8_e4m3fn forward, "
                        f"flashgen/fp8.py); here use torch.float16 or torch.bfloat16")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"flashgen: dtype {q.dtype} is not supported; use torch.float16 or "
                        f"torch.bfloat16 (casting, e.g. q.to(torch.bfloat16), is the caller's "
                        f"choice)")
    check_rank_4_head_dim_contiguous(names, q, k, v)
    return SUPPORTED_DTYPES[q.dtype]


def check_tensors(names: tuple[str, ...], *tensors) -> None:
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashgen: {name} must be a torch.Tensor, got {type(t).__name__}")


def check_on_one_cuda_device(names: tuple[str, ...], *tensors) -> None:
    for name, t in zip(names, tensors):
        if t.device.type != "cuda":
            raise ValueError(f"flashgen: {name} is on {t.device}; flashgen runs on CUDA tensors "
                             f"(move them with .cuda())")
    if len({t.device for t in tensors}) > 1:
        raise ValueError(f"flashgen: {', '.join(names)} must be on one device, got "
                         f"{', '.join(str(t.device) for t in tensors)}")


def check_rank_4_head_dim_contiguous(names: tuple[str, ...], *tensors) -> None:
    for name, t in zip(names, tensors):
        if t.dim() != 4:
            raise ValueError(f"flashgen: {name} must have 4 dimensions, got shape "
                             f"{tuple(t.shape)}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"flashgen: {name}'s last dimension must be contiguous (stride 1), "
                             f"got strides {t.stride()}; pass {name}.contiguous()")


def check_shapes(names: tuple[str, str, str], q, k, v, layout: str) -> None:
    """(batch, seq, heads, dim) views: k and v alike, batch and head dim shared with q, query heads
    a multiple of key/value heads. `layout` names the caller's own layout in the messages."""
    b, _, h, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"flashgen: {names[1]} and {names[2]} must have the same shape "
                         f"{layout}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"flashgen: {names[0]} {tuple(q.shape)} and {names[1]} {tuple(k.shape)} "
                         f"must agree in batch and head dim; layout {layout}")
    hk = k.shape[2]
    if hk == 0 or h % hk:
        raise ValueError(f"flashgen: the number of query heads ({h}) must be a multiple of the "
                         f"number of key/value heads ({hk})")


def passes_tensor_checks(q, k, v, heads_axis: int) -> bool:
    """Whether check_qkv and then check_shapes pass, in one expression: a call with good
    inputs pays for one pass over them (2.2 us instead of 5.6 on a CPU), and the detailed checks
    run only on the rest, to name what is wrong or to accept what this conservatively refuses.
    q, k, v as the caller got them: heads_axis is 2 in (batch, seq, heads, dim), 1 in (batch,
    heads, seq, dim). Must accept nothing that the detailed checks reject."""
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor):
        return False  # not a tensor, or a subclass (FakeTensor, Parameter): the detailed checks
    q_shape, k_shape = q.shape, k.shape
    return (q.is_cuda and k.is_cuda and v.is_cuda
            and q.get_device() == k.get_device() == v.get_device()
            and q.dtype in SUPPORTED_DTYPES and q.dtype == k.dtype == v.dtype
            and len(q_shape) == 4 and len(k_shape) == 4 and k_shape == v.shape
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
            and k_shape[0] == q_shape[0] and k_shape[3] == q_shape[3]
            and k_shape[heads_axis] != 0 and q_shape[heads_axis] % k_shape[heads_axis] == 0)


def check_int32(name: str, t, q) -> None:
    """An index tensor (cu_seqlens, cache_seqlens, block_table): int32, on q's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashgen: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"flashgen: {name} must be int32, got {t.dtype}; pass "
                        f"{name}.to(torch.int32)")
    if t.device != q.device:
        raise ValueError(f"flashgen: {name} is on {t.device}, q on {q.device}")


def check_scale(softmax_scale, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"flashgen: softmax_scale must be a finite positive number, got "
                         f"{softmax_scale!r} (None means 1/sqrt(head_dim))")
    return scale


def check_window(window_size) -> tuple[int, int]:
    """FlashAttention-2's window_size=(left, right): ints >= -1, -1 unbounded."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"flashgen: window_size must be a pair (left, right), got "
                         f"{window_size!r}") from None
    bounds = []
    for name, value in (("left", left), ("right", right)):
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
            value = int(value)  # FlashAttention-2 takes a 0-d integer tensor, as its tests pass
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < -1:
            raise ValueError(f"flashgen: window_size's {name} must be an int >= -1 (-1: "
                             f"unbounded), got window_size={window_size!r}")
        bounds.append(value)
    return tuple(bounds)


def band(causal: bool, window_size, seqlen_q: int, seqlen_k: int, offset: int):
    """The mask kind and its Band (flashgen/band.py) for FlashAttention-2's causal and
    window_size: query i sees key j iff i + offset - left <= j <= i + offset + right, causal
    setting right to 0. A bound that hides nothing for any sequence of at most seqlen_q queries
    and seqlen_k keys counts as unbounded, so a window wider than the sequences runs the dense
    (or causal) kernel. Raises ValueError for a window that is not a pair of ints >= -1."""
    left, right = check_window(window_size)
    if causal:
        right = 0
    # Row i's band ends at i + offset + right: past the last key for every row when
    # right >= seqlen_k - 1 - offset; it starts at or before key 0 for every row when
    # left >= seqlen_q - 1 + offset.
    if left == -1 or left >= max(0, seqlen_q - 1 + offset):
        left = WINDOW_UNBOUNDED
    if right == -1 or right >= max(0, seqlen_k - 1 - offset):
        right = WINDOW_UNBOUNDED
    if left == WINDOW_UNBOUNDED:
        if right == WINDOW_UNBOUNDED:
            return "none", Band(offset, left, right)
        if right == 0:
            return "causal", Band(offset, left, right)
    return "window", Band(offset, left, right)


def check_softcap(softcap) -> float:
    """FlashAttention-2's softcap: a finite number >= 0, 0 for none."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise ValueError(f"flashgen: softcap must be a number >= 0 (0: no capping), got "
                         f"{softcap!r}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"flashgen: softcap must be a finite number >= 0 (0: no capping), got "
                         f"{softcap!r}")
    return float(softcap)


def check_dropout(dropout_p) -> float:
    """FlashAttention-2's and SDPA's dropout_p: the probability of dropping each attention
    probability, a number in [0, 1)."""
    if (isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float))
            or math.isnan(dropout_p) or not 0.0 <= dropout_p < 1.0):
        raise ValueError(f"flashgen: dropout_p must be a number in [0, 1) (the probability of "
                         f"dropping each attention probability; 0 to evaluate), got "
                         f"{dropout_p!r}")
    return float(dropout_p)


def draw_dropout_seed(device) -> torch.Tensor:
    """A call's Philox key for dropout, (1,) int64 on `device`, from torch's CUDA generator:
    torch.manual_seed reproduces it, successive calls draw new ones, and a CUDA graph draws a new
    one at every replay (torch's own graph-safe generator state). A functional randint, which
    torch.compile traces into its graph (an in-place random_ breaks the graph)."""
    return torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device=device)


def with_dropout(mods, dropout_p: float, device, dropout_seed=None):
    """mods with a checked dropout_p > 0 and a fresh key for it (draw_dropout_seed), or the key
    given (an earlier forward's, for its backward: the same key regenerates the same mask)."""
    if dropout_seed is None:
        dropout_seed = draw_dropout_seed(device)
    elif (not isinstance(dropout_seed, torch.Tensor) or dropout_seed.dtype != torch.int64
          or dropout_seed.numel() < 1 or dropout_seed.device != torch.device(device)):
        raise ValueError(f"flashgen: the dropout key (rng_state) must be the int64 tensor on "
                         f"{device} that the forward returned, got {dropout_seed!r}")
    return dataclasses.replace(mods, dropout_p=dropout_p, dropout_seed=dropout_seed[:1])


def modifiers(softcap, alibi_slopes, q, batch: int):
    """The call's score modifier (flashgen/modifiers.py's Modifiers) from FlashAttention-2's
    softcap and alibi_slopes: an fp32 tensor of shape (nheads,) or (batch, nheads) on q's device,
    its last dimension contiguous. q: (batch, seq, nheads, headdim) as the kernels see it."""
    softcap = check_softcap(softcap) if softcap else 0.0
    if alibi_slopes is None:
        return Modifiers(softcap=softcap) if softcap else PLAIN
    _check_fp32("alibi_slopes", alibi_slopes, q, "alibi_slopes.float()")
    heads = q.shape[2]
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"flashgen: alibi_slopes must have shape (nheads,) = ({heads},) or "
                         f"(batch, nheads) = ({batch}, {heads}), got "
                         f"{tuple(alibi_slopes.shape)}")
    if alibi_slopes.stride(-1) != 1:
        alibi_slopes = alibi_slopes.contiguous()
    return Modifiers(softcap=softcap, alibi_slopes=alibi_slopes)


def _check_fp32(name: str, t, q, fix: str) -> None:
    """A per-head (or per-sequence and head) fp32 argument on q's device; fix: the cast."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashgen: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"flashgen: {name} must be float32, got {t.dtype}; pass {fix}")
    if t.device != q.device:
        raise ValueError(f"flashgen: {name} is on {t.device}, q on {q.device}")


def attn_bias(attn_mask, q, seqlen_k: int):
    """SDPA's attn_mask as the bias score modifier's tensor: fp32, (batch, heads, seqlen_q,
    seqlen_k) as a broadcast view (stride 0 where attn_mask broadcasts), keys contiguous; a
    boolean mask becomes 0 where True and -inf where False. Differentiable: a floating mask that
    requires grad gets its gradient through the conversion and the broadcast (autograd sums the
    backward's (batch, heads, seqlen_q, seqlen_k) one down to its shape). q: (batch, seq, heads,
    dim)."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"flashgen: attn_mask must be a torch.Tensor, got "
                        f"{type(attn_mask).__name__}")
    if attn_mask.device != q.device:
        raise ValueError(f"flashgen: attn_mask is on {attn_mask.device}, query on {q.device}")
    batch, seqlen_q, heads, _ = q.shape
    shape = (batch, heads, seqlen_q, seqlen_k)
    if attn_mask.dim() > 4 or any(n not in (1, want) for n, want in
                                  zip(attn_mask.shape[::-1], shape[::-1])):
        raise ValueError(f"flashgen: attn_mask of shape {tuple(attn_mask.shape)} does not "
                         f"broadcast to (batch, heads, seqlen_q, seqlen_k) = {shape}")
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=torch.float32, device=q.device)
        bias.masked_fill_(~attn_mask, -math.inf)
    elif attn_mask.is_floating_point():
        bias = attn_mask.float()
    else:
        raise TypeError(f"flashgen: attn_mask must be boolean or floating point, got "
                        f"{attn_mask.dtype}")
    bias = bias.expand(shape)
    return bias if bias.stride(-1) == 1 else bias.contiguous()


def sink_argument(s_aux, learnable_sink):
    """The sinks by either name (s_aux: vLLM's and gpt-oss's; learnable_sink:
    FlashAttention-4's)."""
    if s_aux is not None and learnable_sink is not None:
        raise ValueError("flashgen: s_aux and learnable_sink name the same sinks; pass one")
    return s_aux if learnable_sink is None else learnable_sink


def with_sinks(mods, sinks, q):
    """mods with checked sinks: one fp32 logit per query head, (nheads,) on q's device, in the
    scaled scores' units (q: (batch, seq, nheads, headdim) as the kernels see it)."""
    if sinks is None:
        return mods
    _check_fp32("s_aux (the sinks)", sinks, q,
                "s_aux.float() (its gradient flows back through the cast)")
    heads = q.shape[2]
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"flashgen: s_aux (the sinks) must have shape (nheads,) = ({heads},), "
                         f"one logit per query head, got {tuple(sinks.shape)}")
    return dataclasses.replace(mods, sinks=sinks.contiguous())


def check_out(out, like, name: str = "out") -> None:
    """A caller's buffer for an output shaped and typed like `like` (any strides: the kernels
    write an aligned one in place, another through a copy)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"flashgen: {name} must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != like.shape:
        raise ValueError(f"flashgen: {name} must have shape {tuple(like.shape)}, got "
                         f"{tuple(out.shape)}")
    if out.dtype != like.dtype or out.device != like.device:
        raise TypeError(f"flashgen: {name} must be {like.dtype} on {like.device}, got "
                        f"{out.dtype} on {out.device}")


def check_sequences(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> None:
    """A variable-length batch's packed q (total_q, ...) and k (total_k, ...) with their
    cu_seqlens and longest lengths: what the host can check, and with FLASHGEN_DEBUG_CHECKS=1
    the device values."""
    _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
            raise ValueError(f"flashgen: {name} must be an int >= 0 (the longest sequence), got "
                             f"{value!r}")
    if debug_checks():
        _check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                 max_seqlen_q, max_seqlen_k)


def _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k) -> None:
    """What the host can check without reading the device."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_int32(name, t, q)
        if t.dim() != 1 or t.shape[0] < 1:
            raise ValueError(f"flashgen: {name} must be 1-D with batch + 1 entries, got shape "
                             f"{tuple(t.shape)}")
        if t.stride(0) != 1 and t.shape[0] > 1:
            raise ValueError(f"flashgen: {name} must be contiguous")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"flashgen: cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k "
                         f"{tuple(cu_seqlens_k.shape)} must have the same length (batch + 1)")


def _check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q,
                             max_seqlen_k) -> None:
    """FLASHGEN_DEBUG_CHECKS=1: the device values, read back (a sync; not under compile)."""
    for name, t, total, longest in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
                                    ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k)):
        values = t.tolist()
        if values[0] != 0 or values[-1] != total:
            raise ValueError(f"flashgen: {name} must start at 0 and end at the total rows "
                             f"({total}), got {values[0]} .. {values[-1]}")
        lengths = [b - a for a, b in zip(values, values[1:])]
        if any(n < 0 for n in lengths):
            raise ValueError(f"flashgen: {name} must not decrease, got {values}")
        if lengths and max(lengths) > longest:
            raise ValueError(f"flashgen: {name} has a sequence of {max(lengths)} rows, more than "
                             f"max_seqlen_{name[-1]}={longest}")
