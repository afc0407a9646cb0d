"""`flashgen bench --mode variants`: attention variants, flashgen against FlexAttention
(torch.compile'd flex_attention, its block mask built once outside the timing) on the same
inputs in one process, forward and forward + backward; plain causal also against SDPA's
FLASH_ATTENTION (FlashAttention-2) and CUDNN_ATTENTION. A window wider than the sequence is timed
against flashgen's own dense kernel (it must cost nothing). Dropout, which FlexAttention does not
take, is timed against those two SDPA backends with the same dropout_p. Causal, the window and
softcap also against FlashAttention-4 (FA4_CASES) where flash-attn-4 is importable.

Every case is causal at seqlen 8k, batch 2, 16 heads (the issue's shapes), at head dims 128 and
64, but the block-sparse one (FlashAttention-1's block-sparse attention is not causal). flashgen
and FA4 run on (batch, seq, heads, dim) tensors, the others on (batch, heads, seq, dim) copies of
the same values, each in its own native layout. The document and block-sparse cases run the
default config's `document` and `block_sparse` variants with their block masks built once outside
the timing, as Flex's are. The block-sparse layout is BigBird's: each 128-block of queries sees
the first key block, its neighbours and RANDOM_BLOCKS random others. The per-head windows case
runs `head_window` with DuoAttention's split: odd heads a causal window of WINDOW keys (streaming
heads), even heads the whole prefix; both sides build per-head block masks. The relative bias case
runs `relative_bias` (a score modifier reading a per-head table by distance). Each implementation
is timed in one block of calls, after the grid's rest (timing.ROUND_REST).
"""

from __future__ import annotations

import json
from pathlib import Path

from flashgen.tools.bench.timing import (ROUND_REST, environment, fa4_call, rest, time_ms,
                                         timed_call)

VARIANTS_MODE = "variants"  # bench's --mode
VARIANT_MODES = ("fwd", "fwd_bwd")
GRID = {"dtype": "bf16", "batch": 2, "heads": 16, "seqlen": 8192, "head_dims": (128, 64)}
WINDOW = 1024
SOFTCAP = 30.0
DOCUMENTS = 8
DROPOUT = 0.1
SPARSE_BLOCK = 128  # the block_sparse variant's block size
RANDOM_BLOCKS = 3
CASES = ("causal", f"window {WINDOW}", f"softcap {SOFTCAP:g}", "alibi",
         f"softcap {SOFTCAP:g} with alibi",
         f"document mask ({DOCUMENTS} docs)", "window wider than the sequence",
         f"dropout {DROPOUT:g}", "block-sparse (BigBird, not causal)",
         f"per-head windows ({WINDOW} on odd heads)", "relative bias (T5)")
SDPA_PEERS = ("FLASH_ATTENTION", "CUDNN_ATTENTION")


class Inputs:
    """What a case's calls share beyond q, k, v: ALiBi's slopes, the documents' ids, the
    block-sparse layout, the per-head windows and the relative-position bias table."""

    def __init__(self, batch: int, heads: int, seqlen: int):
        import torch

        generator = torch.Generator().manual_seed(0)
        self.slopes = torch.pow(2.0, -8.0 * torch.arange(1, heads + 1) / heads).cuda()
        ids = []
        for _ in range(batch):
            cuts = torch.randperm(seqlen - 1, generator=generator)[:DOCUMENTS - 1] + 1
            starts = torch.zeros(seqlen, dtype=torch.int32)
            starts[cuts] = 1
            ids.append(starts.cumsum(0, dtype=torch.int32))
        self.doc_ids = torch.stack(ids).cuda()
        blocks = -(-seqlen // SPARSE_BLOCK)
        layout = torch.zeros(batch, blocks, blocks, dtype=torch.int32)
        rows = torch.arange(blocks)
        layout[:, :, 0] = 1
        for offset in (-1, 0, 1):
            layout[:, rows, (rows + offset).clamp(0, blocks - 1)] = 1
        for b in range(batch):
            picks = torch.randint(blocks, (blocks, RANDOM_BLOCKS), generator=generator)
            layout[b, rows.view(-1, 1), picks] = 1
        self.layout = layout.cuda()
        self.bias = (0.5 * torch.randn(heads, 2 * seqlen - 1, generator=generator)).cuda()
        self.windows = torch.where(torch.arange(heads) % 2 == 1, WINDOW, -1).int().cuda()


def _flashgen(case: str, inputs: Inputs, q, k):
    """flashgen's call (q, k, v) -> out for the case, (batch, seq, heads, dim)."""
    import flashgen
    from flashgen import flash_attn_func

    kwargs = {"causal": True}
    if case.startswith("window "):
        kwargs["window_size"] = (1 << 20 if "wider" in case else WINDOW, 0)
    elif case.startswith("softcap"):
        kwargs["softcap"] = SOFTCAP
        if case.endswith("alibi"):
            kwargs["alibi_slopes"] = inputs.slopes
    elif case == "alibi":
        kwargs["alibi_slopes"] = inputs.slopes
    elif case.startswith("dropout"):
        kwargs["dropout_p"] = DROPOUT
    elif case.startswith("document"):
        tensors = {"doc_ids": inputs.doc_ids}
        kwargs = {"variant": "document", "variant_tensors": tensors,
                  "block_mask": flashgen.block_mask("document", q, k, tensors)}
    elif case.startswith("block-sparse"):
        tensors = {"layout": inputs.layout}
        kwargs = {"variant": "block_sparse", "variant_tensors": tensors,
                  "block_mask": flashgen.block_mask("block_sparse", q, k, tensors)}
    elif case.startswith("relative bias"):
        kwargs.update(variant="relative_bias", variant_tensors={"bias": inputs.bias})
    elif case.startswith("per-head windows"):
        tensors = {"window": inputs.windows}
        kwargs = {"variant": "head_window", "variant_tensors": tensors,
                  "block_mask": flashgen.block_mask("head_window", q, k, tensors)}
    return lambda q, k, v: flash_attn_func(q, k, v, **kwargs)


def _flex(case: str, inputs: Inputs, batch: int, heads: int, seqlen: int):
    """FlexAttention's compiled call (q, k, v) -> out for the case, (batch, heads, seq, dim)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)

    doc_ids = inputs.doc_ids

    def document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    layout = inputs.layout

    def block_sparse(b, h, q_idx, kv_idx):
        return layout[b, q_idx // SPARSE_BLOCK, kv_idx // SPARSE_BLOCK] != 0

    windows = inputs.windows

    def head_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((windows[h] < 0) | (q_idx - kv_idx < windows[h]))

    mask_mod = causal
    if case.startswith("window ") and "wider" not in case:
        mask_mod = window
    elif case.startswith("document"):
        mask_mod = document
    elif case.startswith("block-sparse"):
        mask_mod = block_sparse
    elif case.startswith("per-head windows"):
        mask_mod = head_window
    block_mask = create_block_mask(mask_mod, batch, heads, seqlen, seqlen, device="cuda")
    score_mod = None
    if case.startswith("softcap") and case.endswith("alibi"):
        slopes = inputs.slopes

        def score_mod(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP) - slopes[h] * (q_idx - kv_idx).abs()
    elif case.startswith("softcap"):
        def score_mod(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP)
    elif case == "alibi":
        slopes = inputs.slopes

        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()
    elif case.startswith("relative bias"):
        bias, middle = inputs.bias, (inputs.bias.shape[1] - 1) // 2

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[h, kv_idx - q_idx + middle]
    # A fresh compile per case: one compiled function over every case's masks and score mods
    # would hit dynamo's recompile limit and fall back to the unfused implementation.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)


# The cases FlashAttention-4 runs (its flash_attn_func's arguments), all causal like flashgen's.
FA4_CASES = {"causal": {}, f"window {WINDOW}": {"window_size": (WINDOW, 0)},
             f"softcap {SOFTCAP:g}": {"softcap": SOFTCAP}}


def _fa4(case: str):
    """FlashAttention-4's call (q, k, v) -> out for the case, (batch, seq, heads, dim); where
    flash-attn-4 is not importable, a call that raises why (the row records it)."""
    try:
        return fa4_call(causal=True, **FA4_CASES[case])
    except NotImplementedError as e:
        def unavailable(q, k, v, why=str(e)):
            raise NotImplementedError(why)
        return unavailable


def _sdpa(backend_name: str, dropout_p: float = 0.0):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def call(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return call


def selected_cases(prefixes=None) -> tuple[str, ...]:
    """The cases whose names start with one of the prefixes (None: every case)."""
    if not prefixes:
        return CASES
    chosen = tuple(c for c in CASES if any(c.startswith(p) for p in prefixes))
    if not chosen:
        raise ValueError(f"flashgen bench: no variants case starts with {list(prefixes)}; cases: "
                         f"{list(CASES)}")
    return chosen


def _time(mode: str, fn, inputs) -> dict:
    try:
        call, sets, reset = timed_call(mode, fn, inputs)
        return {"ms": time_ms(call, sets, reset=reset)}
    except (RuntimeError, NotImplementedError, AssertionError) as e:  # FA4 asserts on inputs
        return {"error": (str(e).splitlines() or [type(e).__name__])[0][:200]}


def run(grid: dict = GRID, log=print) -> dict:
    import torch

    from flashgen import flash_attn_func

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[grid["dtype"]]
    batch, heads, seqlen = grid["batch"], grid["heads"], grid["seqlen"]
    inputs = Inputs(batch, heads, seqlen)
    rows = []
    for head_dim in grid["head_dims"]:
        bshd = [[torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype)
                 for _ in range(3)] for _ in range(2)]
        bhsd = [[t.transpose(1, 2).contiguous() for t in tensors] for tensors in bshd]
        for case in grid.get("cases", CASES):
            impls = {"flashgen": _flashgen(case, inputs, *bshd[0][:2])}
            layouts = {"flashgen": bshd}
            if "wider" in case:
                impls["flashgen causal"] = lambda q, k, v: flash_attn_func(q, k, v, causal=True)
                layouts["flashgen causal"] = bshd
            elif not case.startswith("dropout"):
                impls["FlexAttention"] = _flex(case, inputs, batch, heads, seqlen)
                layouts["FlexAttention"] = bhsd
            if case in FA4_CASES:
                impls["FA4"] = _fa4(case)
                layouts["FA4"] = bshd
            if case == "causal" or case.startswith("dropout"):
                for peer in SDPA_PEERS:
                    impls[peer] = _sdpa(peer, DROPOUT if case.startswith("dropout") else 0.0)
                    layouts[peer] = bhsd
            for mode in VARIANT_MODES:
                row = {"case": case, "head_dim": head_dim, "mode": mode, "dtype": grid["dtype"],
                       "batch": batch, "heads": heads, "seqlen": seqlen, "results": {}}
                for name, fn in impls.items():
                    rest(ROUND_REST)  # from a rested clock, whatever ran before (timing.py)
                    row["results"][name] = _time(mode, fn, layouts[name])
                    torch.cuda.empty_cache()
                rows.append(row)
                log(format_row(row))
    return {"environment": environment(), "grid": dict(grid), "rows": rows}


def _ratio(row: dict, peer: str) -> float | None:
    ours, theirs = row["results"].get("flashgen", {}), row["results"].get(peer, {})
    if "ms" in ours and "ms" in theirs:
        return theirs["ms"] / ours["ms"]
    return None


def format_row(row: dict) -> str:
    parts = [f"hd{row['head_dim']} {row['mode']:7} {row['case']:32}"]
    for name, result in row["results"].items():
        parts.append(f"{name} {result['ms']:.3f} ms" if "ms" in result else
                     f"{name} {result.get('error', '?')}")
    return " | ".join(parts)


def markdown(result: dict, command: str) -> str:
    env = result["environment"]
    grid = result["grid"]
    lines = [f"# Attention variants: flashgen vs FlexAttention ({env['gpu']})", "",
             f"`{command}`, {env['date']}, torch {env['torch']}, flashgen "
             f"{env.get('flashgen_commit')}. {grid['dtype']}, batch {grid['batch']}, "
             f"{grid['heads']} heads, seqlen {grid['seqlen']}, causal; medians of CUDA-event-timed "
             f"calls. Speedup: the peer's time over flashgen's.", "",
             "| head dim | mode | case | flashgen ms | peer | peer ms | speedup |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        ours = row["results"]["flashgen"]
        for peer, theirs in row["results"].items():
            if peer == "flashgen":
                continue
            ratio = _ratio(row, peer)
            theirs_ms = f"{theirs['ms']:.3f}" if "ms" in theirs else "fails (results.json)"
            lines.append(f"| {row['head_dim']} | {row['mode']} | {row['case']} | "
                         f"{ours.get('ms', float('nan')):.3f} | {peer} | {theirs_ms} | "
                         f"{'' if ratio is None else f'{ratio:.2f}x'} |")
    return "\n".join(lines) + "\n"


def write(result: dict, out: str | Path, command: str) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps({**result, "command": command}, indent=1) + "\n")
    paths[1].write_text(markdown(result, command))
    return paths
