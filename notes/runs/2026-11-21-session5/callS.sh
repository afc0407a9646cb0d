# Call S (H100): every default sm_90 kernel built, the GPU test suite, then the forward grid
# against FlashAttention-2 and cuDNN as far as the call's time allows.
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache
[ -d $FLASHGEN_CACHE_DIR/sm_90 ] || { mkdir -p $FLASHGEN_CACHE_DIR; tar xzf scratch/fwd.tgz -C $FLASHGEN_CACHE_DIR; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv; nvcc --version | tail -2; } | tee $OUT/gpu.txt
python3 -m flashgen generate --arch sm_90 --jobs 16 > $OUT/generate.log 2>&1; tail -1 $OUT/generate.log
python3 -m flashgen list --arch sm_90 > $OUT/kernels.txt 2>&1
timeout 260 python3 -m pytest tests -q -rs -m "not nvcc" -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -3
