# Call C (H100): the whole GPU suite and compute-sanitizer (scripts/gpu_check.sh, kernels from
# call A's cache), then the grid's closest backward cells again, both timing methods:
#   bash notes/runs/2026-11-23-session9/callC.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session9
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
SKIP_BENCH=1 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider
export PYTHONPATH=$R:/tmp/site
for dtype in bf16 fp16; do
  python3 $N/sweep_bwd_order.py $dtype 64:2048:0 64:4096:0 64:8192:0 64:16384:0 64:2048:1 \
    128:2048:1 128:4096:1 2>&1 | grep -v -i warn
done | tee $OUT/sweep.txt
