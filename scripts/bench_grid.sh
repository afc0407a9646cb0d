#!/usr/bin/env bash
# The committed benchmark: FlashAttention's full grid (bf16 and fp16; head dims 64, 128, 256;
# causal off and on; seqlen 512 to 16k), forward and backward, every SDPA backend, then peak
# memory (forward and forward+backward) and host overhead. Run on the GPU after
# scripts/gpu_check.sh has built the kernels (same environment variables):
#   bash scripts/bench_grid.sh            # results to $OUT or bench/results/
set -uo pipefail
OUT=${OUT:-$PWD/bench/results}
mkdir -p "$OUT"
python3 -m flashgen bench --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v '^ '
python3 -m flashgen bench --plot "$OUT/results.json"
python3 -m flashgen bench --memory 2>&1 | tee "$OUT/memory.txt" | tail -20
python3 -m flashgen bench --overhead 2>&1 | tee "$OUT/overhead.txt"
