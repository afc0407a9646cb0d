# Call G (H100), tree with the L2 rule for the sorted tail: the GPU suite, then the backward grid
# at seqlen 2k-16k twice (as call E), kernels from call A's cache (the rule is host-side only):
#   bash notes/runs/2026-11-23-session9/callG.sh
set -uo pipefail
R=$PWD
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
SKIP_BENCH=1 SKIP_SANITIZE=1 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider 2>&1 | tail -3
export PYTHONPATH=$R:/tmp/site
for run in 1 2; do
  mkdir -p $OUT/run$run
  python3 -m flashgen bench --mode bwd --head-dim 64 --head-dim 128 --head-dim 256 --seqlen 2048 \
    --seqlen 4096 --seqlen 8192 --seqlen 16384 --impl flashgen --impl FLASH_ATTENTION \
    --out $OUT/run$run 2>&1 | grep -v '^ ' | grep bwd > $OUT/run$run/bench.log
done
python3 notes/runs/2026-11-23-session9/runs_per_cell.py $OUT/run1/results.json $OUT/run2/results.json | tail -2
