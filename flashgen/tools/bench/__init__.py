"""`flashgen bench`: flashgen against PyTorch's SDPA backends, in one process, on one GPU.

FlashAttention's convention: batch * seqlen = 16k tokens, heads * head_dim = 2048 (--batch and
--heads replace either, e.g. batch 1 for the few-sequence shapes where the forward's shape-aware
tile choice pays: flashgen_main_tile times the main tile alone). Forward FLOPs
are 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved when causal; the backward counts
2.5x the forward (five matmuls to the forward's two), forward + backward 3.5x. Times are medians
of CUDA-event-timed calls after warm-up, issued back to back (host work overlaps earlier GPU
work, as in training), on fresh random inputs, rotating input sets when they would fit in L2; a
cell times its implementations in interleaved rounds (timing.ROUNDS), each implementation's
calls after a rest (timing.ROUND_REST) so that none starts at a clock the power cap cut for the
one before it.
Each cell is measured per mode: fwd (the forward), bwd (out.backward(dout) of a forward run
once, untimed, as FlashAttention's benchmark_backward does) and fwd_bwd (both).

grid.py: what is measured and its FLOPs; timing.py: timing cells and a run's document;
report.py: the document's schema, Markdown and plots; peak_memory.py: peak memory (--memory);
overhead.py: host time per call (--overhead); serving.py: attention over a KV cache (--mode
decode, --mode prefill); variants.py: windows and softcap against FlexAttention (--mode
variants).
"""

from flashgen.tools.bench.grid import (DEFAULT_GRID, DEFAULT_MODES, IMPLEMENTATIONS,
                                       KNOWN_IMPLEMENTATIONS, MODES)
from flashgen.tools.bench.overhead import overhead_us
from flashgen.tools.bench.peak_memory import MEMORY_IMPLS, MEMORY_MODES, MEMORY_SEQLENS, memory
from flashgen.tools.bench.report import plot, upgraded, write
from flashgen.tools.bench.serving import SERVING_MODES
from flashgen.tools.bench.timing import run
from flashgen.tools.bench.variants import VARIANTS_MODE

__all__ = ["DEFAULT_GRID", "DEFAULT_MODES", "IMPLEMENTATIONS", "KNOWN_IMPLEMENTATIONS",
           "MEMORY_IMPLS", "MEMORY_MODES", "MEMORY_SEQLENS", "MODES", "SERVING_MODES",
           "VARIANTS_MODE", "memory",
           "overhead_us", "plot", "run", "upgraded", "write"]
