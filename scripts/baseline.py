"""Forward baseline over seqlens 512..16k (bf16, head dims 64/128/256, causal off/on) and the
host overhead of a tiny call, for the notes. Run where the kernels are built (FLASHGEN_CACHE_DIR)."""

from flashgen import bench

bench.run(dtypes=("bf16",), head_dims=(64, 128, 256), seqlens=(512, 1024, 2048, 4096, 8192, 16384))
print("overhead", bench.overhead_us())
