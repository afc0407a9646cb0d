# Call T (H100): the forward grid (bf16 and fp16, hd 64/128/256, causal off/on, seqlen 512-16k)
# against FlashAttention-2 and cuDNN; $1 = mode (fwd or bwd), $2.. extra bench args.
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache
[ -d $FLASHGEN_CACHE_DIR/sm_90 ] || { mkdir -p $FLASHGEN_CACHE_DIR; tar xzf scratch/fwd.tgz -C $FLASHGEN_CACHE_DIR; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mode=$1; shift
python3 -m flashgen generate --arch sm_90 --jobs 16 --direction $mode > $OUT/generate.log 2>&1; tail -1 $OUT/generate.log
[ $mode = bwd ] && { python3 -m flashgen generate --arch sm_90 --jobs 16 --direction fwd >> $OUT/generate.log 2>&1; tail -1 $OUT/generate.log; }
timeout 520 python3 -m flashgen bench --mode $mode --impl flashgen --impl FLASH_ATTENTION --impl CUDNN_ATTENTION "$@" --out $OUT/$mode 2>&1 | tee $OUT/bench_$mode.log | grep -E "x$" | sed 's/  */ /g'
