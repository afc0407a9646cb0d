# Call F (H100): the grid's (call C grid) weakest hd128 cells again, three times each: causal,
# seqlen 2k/4k, bf16 and fp16, forward and backward, flashgen against FLASH_ATTENTION. The grid
# read the unchanged forward kernel at 163 TFLOP/s on fp16 causal 2k (0.64x; session 6: 1.05x).
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
mkdir -p $FLASHGEN_CACHE_DIR && tar xzf scratch/sm90-cache.tgz -C $FLASHGEN_CACHE_DIR
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
python3 -m flashgen generate --arch sm_90 --head-dim 128 --causal true --jobs 16 2>&1 | tail -1
for rep in 1 2 3; do
  python3 -m flashgen bench --dtype bf16 --dtype fp16 --head-dim 128 --causal true --seqlen 2048 \
    --seqlen 4096 --impl flashgen --impl FLASH_ATTENTION 2>&1 | grep -E "^(fwd|bwd) " | sed "s/^/rep$rep /"
done | tee $OUT/repeat.txt
