"""`flashgen bench --mode decode` and `--mode prefill`: attention over a KV cache, flashgen's
flash_attn_with_kvcache against SDPA's FLASH_ATTENTION and CUDNN_ATTENTION (enable_gqa=True) on
the same inputs, in one process.

decode: new tokens 1 and 4 read a cache of 1k-128k keys, contiguous and paged (pages 1, 16 and
64 in a shuffled block table over the same memory, so every implementation reads the same bytes;
the peers read it as contiguous). All attend to the whole cache (no mask: with 1-4 queries a
causal mask hides at most 3 keys, and SDPA's is_causal aligns top-left, which is not decoding's
mask). Each cell reports time and the fraction of the measured device copy rate that the cell's
K + V bytes over its time make. prefill (chunked): 512 or 2048 new queries over a cache of
8k-128k keys with the bottom-right causal mask (SDPA: causal_lower_right).

FlashAttention-4 (flash-attn-4's flash_attn_varlen_func, seqused_k at the cache's length) runs
the contiguous cells beside SDPA's where it is importable, and records why where it is not.
FlashInfer (flashinfer-python's BatchDecodeWithPagedKVCacheWrapper, NHD) reads the paged 16
cells' caches through the same block table, one new token, where it is importable (planned once
outside the timing, as a serving engine plans a step for every layer); a cell records why where
it is not.

Every implementation's call is timed twice (medians of CUDA events): captured in a CUDA graph
and replayed, as serving engines run decode steps, which times the GPU's work; and eagerly, back
to back (`eager_us`), as transformers' generate() and most research code call it, where a small
cell's time is its host time. Caches under the 50 MB L2 stay in it between replays, so small
cells show bandwidths above the copy rate, for every implementation alike.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

from flashgen.tools.bench.grid import FA4
from flashgen.tools.bench.timing import environment, time_ms

SERVING_MODES = ("decode", "prefill")
SDPA_PEERS = ("FLASH_ATTENTION", "CUDNN_ATTENTION")
PEERS = (*SDPA_PEERS, FA4)  # the contiguous cells' peers; the faster peer: the fastest that ran
FLASHINFER = "FlashInfer"
FLASHINFER_PAGE = 16  # the page size it is timed at (vLLM's default)
FLASHINFER_WORKSPACE_BYTES = 128 << 20  # its documented split-k workspace
DECODE_GRID = {"dtypes": ("bf16", "fp16"), "head_dims": (128, 64), "heads": ((32, 8), (32, 32)),
               "batches": (1, 8, 32, 128), "cache_lengths": (1024, 8192, 32768, 131072),
               "new_tokens": (1, 4), "page_sizes": (0, 1, 16, 64)}
PREFILL_GRID = {"dtypes": ("bf16",), "head_dims": (128,), "heads": ((32, 8),), "batches": (1,),
                "cache_lengths": (8192, 32768, 131072), "new_tokens": (512, 2048),
                "page_sizes": (0, 64, 256)}
MAX_CACHE_BYTES = 40 << 30  # cells whose K + V exceed this are skipped
LARGE_CACHE_BYTES = 256 << 20  # the bandwidth target applies above this


def copy_rate() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + written)."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), [()], warmup=3, repeats=10)
    return 2 * src.numel() / (ms * 1e-3)


def cells(grid: dict):
    for dtype, head_dim, (heads, heads_kv), batch, length, new, page in itertools.product(
            grid["dtypes"], grid["head_dims"], grid["heads"], grid["batches"],
            grid["cache_lengths"], grid["new_tokens"], grid["page_sizes"]):
        kv_bytes = 2 * batch * length * heads_kv * head_dim * 2
        if kv_bytes <= MAX_CACHE_BYTES:
            yield dict(dtype=dtype, head_dim=head_dim, heads=heads, heads_kv=heads_kv,
                       batch=batch, cache_length=length, new_tokens=new, page_size=page,
                       kv_bytes=kv_bytes)


def _inputs(cell: dict):
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cell["dtype"]]
    b, length, new = cell["batch"], cell["cache_length"], cell["new_tokens"]
    q = torch.randn(b, new, cell["heads"], cell["head_dim"], device="cuda", dtype=dtype)
    k, v = (torch.randn(b, length, cell["heads_kv"], cell["head_dim"], device="cuda",
                        dtype=dtype) for _ in range(2))
    table = None
    page = cell["page_size"]
    if page:
        per_seq = length // page
        # each sequence's own pages, shuffled: the same keys, in pages scattered over its region
        table = (torch.argsort(torch.rand(b, per_seq, device="cuda"), dim=1)
                 + per_seq * torch.arange(b, device="cuda")[:, None]).to(torch.int32)
    return q, k, v, table


def _flashgen(cell, q, k, v, table, causal):
    from flashgen import flash_attn_with_kvcache

    length = cell["cache_length"]
    seqlens = torch_full(q.shape[0], length, q.device)
    if table is not None:
        page = cell["page_size"]
        k = k.view(-1, page, *k.shape[2:])
        v = v.view(-1, page, *v.shape[2:])
    return lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table,
                                           causal=causal)


def _fa4(cell, q, k, v, causal):
    """FlashAttention-4's attention of the cell's new tokens over its contiguous cache (all of
    it in use: seqused_k as serving passes it); NotImplementedError where flash-attn-4 is not
    importable."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError as e:
        raise NotImplementedError(f"FlashAttention-4 is not importable ({e}); pip install "
                                  "flash-attn-4") from e
    seqlens = torch_full(q.shape[0], cell["cache_length"], q.device)
    return lambda: flash_attn_varlen_func(q, k, v, seqused_k=seqlens, causal=causal)[0]


def _flashinfer(cell, q, k, v, table):
    """FlashInfer's paged decode of the cell's one new token over its block table; its plan (the
    schedule of the batch's pages) made here, outside the timing. NotImplementedError where
    flashinfer is not importable."""
    try:
        import flashinfer
    except ImportError as e:
        raise NotImplementedError(f"FlashInfer is not importable ({e}); pip install "
                                  "flashinfer-python") from e
    import torch

    page, batch = cell["page_size"], q.shape[0]
    per_seq = cell["cache_length"] // page
    indptr = torch.arange(0, (batch + 1) * per_seq, per_seq, dtype=torch.int32, device=q.device)
    indices, last_page_len = table.reshape(-1), torch_full(batch, page, q.device)
    # Its CUDA-graph mode (the plan's tensors as fixed buffers), as serving engines run it; CUDA
    # cores, vLLM's choice for query groups of at most 4.
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device), "NHD",
        use_cuda_graph=True, use_tensor_cores=cell["heads"] // cell["heads_kv"] > 4,
        paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last_page_len)
    wrapper.plan(indptr, indices, last_page_len, cell["heads"], cell["heads_kv"],
                 cell["head_dim"], page, q_data_type=q.dtype, kv_data_type=q.dtype)
    paged = (k.view(-1, page, *k.shape[2:]), v.view(-1, page, *v.shape[2:]))
    one_token = q[:, 0]  # (batch, heads, dim)
    return lambda: wrapper.run(one_token, paged)


def torch_full(batch, value, device):
    import torch

    return torch.full((batch,), value, dtype=torch.int32, device=device)


def _peer(name, q, k, v, causal):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    mask = causal_lower_right(q.shape[1], k.shape[1]) if causal else None
    backend = getattr(SDPBackend, name)

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
    return call


def _graphed(fn):
    """Replays of fn's launches captured in a CUDA graph (after two warm-up calls)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure(cell: dict, causal: bool, rate: float) -> dict:
    import torch

    q, k, v, table = _inputs(cell)
    row = dict(cell)
    impls = {"flashgen": _flashgen(cell, q, k, v, table, causal)}
    if not cell["page_size"]:
        impls.update({name: _peer(name, q, k, v, causal) for name in SDPA_PEERS})
        try:
            impls[FA4] = _fa4(cell, q, k, v, causal)
        except NotImplementedError as e:
            row[FA4] = {"error": str(e)}
    elif cell["page_size"] == FLASHINFER_PAGE and cell["new_tokens"] == 1 and not causal:
        try:
            impls[FLASHINFER] = _flashinfer(cell, q, k, v, table)
        except NotImplementedError as e:
            row[FLASHINFER] = {"error": str(e)}
    for name, fn in impls.items():
        try:
            ms = time_ms(_graphed(fn), [()], warmup=3, repeats=20)
            eager_ms = time_ms(fn, [()], warmup=10, repeats=50)
        except (RuntimeError, ValueError, AssertionError) as e:  # no kernel for the shape, out of
            # memory, FA4's asserts on its inputs
            row[name] = {"error": str(e).splitlines()[0][:200]}
            continue
        row[name] = {"us": ms * 1e3, "bandwidth": cell["kv_bytes"] / (ms * 1e-3) / rate,
                     "eager_us": eager_ms * 1e3}
    del q, k, v, table
    torch.cuda.empty_cache()
    return row


def run(mode: str, grid: dict | None = None, log=print) -> dict:
    """Every cell of the mode's grid (decode: paged cells time flashgen alone; the table puts
    them beside the contiguous cell's peers)."""
    grid = grid or (DECODE_GRID if mode == "decode" else PREFILL_GRID)
    rate = copy_rate()
    log(f"copy rate {rate / 1e12:.2f} TB/s")
    rows = []
    for cell in cells(grid):
        row = measure(cell, causal=mode == "prefill", rate=rate)
        rows.append(row)
        log(_line(row))
    return {"mode": mode, "copy_rate": rate, "environment": environment(), "grid": grid,
            "rows": rows}


def _us(entry, timing: str = "us") -> float | None:
    """An implementation's graph-replay time (timing "us") or eager one ("eager_us")."""
    return entry.get(timing) if isinstance(entry, dict) else None


def _line(row) -> str:
    parts = [f"{row['dtype']} hd{row['head_dim']} h{row['heads']}/{row['heads_kv']} "
             f"b{row['batch']} L{row['cache_length']} new{row['new_tokens']} "
             f"page{row['page_size']}"]
    for name in ("flashgen", *PEERS, FLASHINFER):
        entry = row.get(name)
        if entry is None:
            continue
        us = _us(entry)
        parts.append(f"{name} " + (f"{us:.1f} us {entry['bandwidth']:.0%} eager "
                                   f"{_us(entry, 'eager_us'):.1f} us" if us is not None
                                   else entry["error"]))
    return "  ".join(parts)


def summary(result: dict) -> dict:
    """Ratios of flashgen to the faster peer (contiguous cell's peers for paged cells) and to
    FlashInfer (on its own paged cells), the bandwidth of large cells, 4 new tokens against 1
    and pages of 1 and 16 against contiguous."""
    rows = result["rows"]
    key = lambda r, **change: tuple({**r, **change}[k] for k in (  # noqa: E731
        "dtype", "head_dim", "heads", "heads_kv", "batch", "cache_length", "new_tokens",
        "page_size"))
    by_key = {key(r): r for r in rows}
    ratios, eager_ratios, large, new_vs_one = [], [], [], []
    page_vs_dense = {1: [], 16: []}
    vs_flashinfer = {"us": [], "eager_us": []}
    vs_fa4 = {"us": [], "eager_us": []}
    for r in rows:
        ours = _us(r["flashgen"])
        if ours is None:
            continue
        dense = by_key.get(key(r, page_size=0), r)
        peers = [u for u in (_us(dense.get(p, {})) for p in PEERS) if u is not None]
        if peers:
            ratios.append(min(peers) / ours)
        eager = [u for u in (_us(dense.get(p, {}), "eager_us") for p in PEERS) if u is not None]
        if eager and _us(r["flashgen"], "eager_us"):
            eager_ratios.append(min(eager) / _us(r["flashgen"], "eager_us"))
        if r["kv_bytes"] > LARGE_CACHE_BYTES:
            large.append(r["flashgen"]["bandwidth"])
        if r["new_tokens"] != 1 and key(r, new_tokens=1) in by_key:
            one = _us(by_key[key(r, new_tokens=1)]["flashgen"])
            if one:
                new_vs_one.append(ours / one)
        if r["page_size"] in page_vs_dense and _us(dense["flashgen"]):
            page_vs_dense[r["page_size"]].append(ours / _us(dense["flashgen"]))
        for peer, ratios_by_timing in ((FLASHINFER, vs_flashinfer), (FA4, vs_fa4)):
            theirs_row = r if peer == FLASHINFER else dense  # FA4 runs the contiguous cell
            for timing, values in ratios_by_timing.items():
                theirs, mine = _us(theirs_row.get(peer), timing), _us(r["flashgen"], timing)
                if theirs and mine:
                    values.append(theirs / mine)

    def stats(values):
        return ({"min": min(values), "median": statistics.median(values), "max": max(values),
                 "n": len(values)} if values else None)
    return {"vs_faster_peer": stats(ratios), "vs_faster_peer_eager": stats(eager_ratios),
            "large_cache_bandwidth": stats(large),
            "new_tokens_time_vs_one": stats(new_vs_one),
            **{f"page{page}_time_vs_dense": stats(values)
               for page, values in page_vs_dense.items()},
            "vs_flashinfer": stats(vs_flashinfer["us"]),
            "vs_flashinfer_eager": stats(vs_flashinfer["eager_us"]),
            "vs_fa4": stats(vs_fa4["us"]), "vs_fa4_eager": stats(vs_fa4["eager_us"])}


def markdown(result: dict, command: str) -> str:
    lines = [f"# flashgen bench --mode {result['mode']}", "", f"Command: `{command}`", "",
             f"Device copy rate: {result['copy_rate'] / 1e12:.2f} TB/s. Environment: "
             f"`{json.dumps(result['environment'])}`", ""]
    s = summary(result)
    for name, values in s.items():
        if values:
            lines.append(f"- {name}: median {values['median']:.3f}, min {values['min']:.3f}, "
                         f"max {values['max']:.3f} over {values['n']} cells")
    rows = result["rows"]
    # FA4's and FlashInfer's columns where they ran in some cell (FlashInfer: its paged 16 cells)
    fa4 = any(_us(r.get(FA4)) for r in rows)
    flashinfer = any(_us(r.get(FLASHINFER)) for r in rows)
    lines += ["", "Graph: CUDA-graph replay; eager: back-to-back calls. The faster peer: the "
              "fastest of the contiguous cell's peers.", "",
              "| dtype | hd | heads | batch | cache | new | page | flashgen graph us (bw) | "
              "eager | FA2 graph us (bw) | eager | cuDNN graph us (bw) | eager |"
              + (" FA4 graph us (bw) | eager |" if fa4 else "")
              + " vs faster peer, graph | eager |"
              + (" FlashInfer graph us (bw) | eager | vs FlashInfer, graph | eager |"
                 if flashinfer else ""),
              "|" + "---|" * (15 + 2 * fa4 + 4 * flashinfer)]
    dense = {tuple(r[k] for k in ("dtype", "head_dim", "heads", "heads_kv", "batch",
                                  "cache_length", "new_tokens")): r
             for r in rows if not r["page_size"]}

    def cell(entry):
        us = _us(entry) if entry else None
        if us is None:
            return "- | -"
        eager = _us(entry, "eager_us")
        return f"{us:.1f} ({entry['bandwidth']:.0%}) | " + (f"{eager:.1f}" if eager else "-")

    def ratio(timing, d, r, peers=PEERS):
        theirs = [u for u in (_us(d.get(p), timing) for p in peers) if u is not None]
        ours = _us(r["flashgen"], timing)
        return f"{min(theirs) / ours:.2f}" if theirs and ours else "-"
    for r in rows:
        d = dense.get(tuple(r[k] for k in ("dtype", "head_dim", "heads", "heads_kv", "batch",
                                           "cache_length", "new_tokens")), r)
        lines.append(f"| {r['dtype']} | {r['head_dim']} | {r['heads']}/{r['heads_kv']} | "
                     f"{r['batch']} | {r['cache_length']} | {r['new_tokens']} | "
                     f"{r['page_size'] or '-'} | {cell(r['flashgen'])} | "
                     f"{cell(d.get('FLASH_ATTENTION'))} | {cell(d.get('CUDNN_ATTENTION'))} | "
                     + (f"{cell(d.get(FA4))} | " if fa4 else "")
                     + f"{ratio('us', d, r)} | {ratio('eager_us', d, r)} |"
                     + (f" {cell(r.get(FLASHINFER))} | {ratio('us', r, r, (FLASHINFER,))} | "
                        f"{ratio('eager_us', r, r, (FLASHINFER,))} |" if flashinfer else ""))
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "results.json"
    md_path = out / "results.md"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    md_path.write_text(markdown(result, command))
    return [json_path, md_path]
