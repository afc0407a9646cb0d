"""A packed training batch through flash_attn_varlen_func: one 8k document among 62 shorter ones
(200-1700 rows, 67,801 rows in all), head dim 128, 32 query and 8 KV heads, causal, bf16. Prints
forward + backward time (three medians of 20 event-timed calls) and the peak memory a call
allocates beyond its inputs (the backward's workspaces show there).

    python3 scripts/varlen_documents.py
"""

import torch

from flashgen import flash_attn_varlen_func
from flashgen.tools.bench.timing import time_ms


def main():
    generator = torch.Generator().manual_seed(0)
    lengths = [8192] + torch.randint(200, 1700, (62,), generator=generator).tolist()
    total, heads, heads_kv, head_dim = sum(lengths), 32, 8, 128
    q = torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    k, v = (torch.randn(total, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    dout = torch.randn_like(q)

    def step():
        flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                               causal=True).backward(dout)

    step()
    torch.cuda.synchronize()
    inputs = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - inputs
    times = [time_ms(step, [()], repeats=20) for _ in range(3)]
    print(f"{len(lengths)} sequences, {total} rows, longest {max(lengths)}: forward + backward "
          + " ".join(f"{t:.3f}" for t in times) + f" ms, peak above inputs {peak / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
