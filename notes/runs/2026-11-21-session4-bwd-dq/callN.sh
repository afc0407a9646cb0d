# Call N: build every default kernel for the GPU, a quick backward bench (bf16/fp16, hd 64/128/256),
# then the GPU test suite.
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache
mkdir -p $FLASHGEN_CACHE_DIR; tar xzf scratch/fwd.tgz -C $FLASHGEN_CACHE_DIR
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -m flashgen generate --arch sm_90 --jobs 16 > $OUT/generate.log 2>&1; tail -2 $OUT/generate.log
python3 -m flashgen list --arch sm_90 2>&1 | grep bwd | head -30 > $OUT/list.txt
timeout 170 python3 -m flashgen bench --dtype bf16 --dtype fp16 --seqlen 4096 --seqlen 16384 --head-dim 64 --head-dim 128 --head-dim 256 \
  --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed 's/  */ /g' | tee $OUT/bwd_quick.txt
timeout 330 python3 -m pytest tests -q -rs -m "not nvcc" -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -15
