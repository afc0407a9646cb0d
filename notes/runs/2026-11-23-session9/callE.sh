# Call E (H100): call D's backward grid twice more, each run its own process (per-cell spread
# across runs), kernels from call A's cache:  bash notes/runs/2026-11-23-session9/callE.sh
set -uo pipefail
R=$PWD
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
python3 -m flashgen generate --arch sm_90 --jobs 16 > /tmp/generate.log 2>&1 || { tail -30 /tmp/generate.log; exit 1; }
for run in 1 2; do
  mkdir -p $OUT/run$run
  python3 -m flashgen bench --mode bwd --head-dim 64 --head-dim 128 --head-dim 256 --seqlen 2048 \
    --seqlen 4096 --seqlen 8192 --seqlen 16384 --impl flashgen --impl FLASH_ATTENTION \
    --out $OUT/run$run 2>&1 | grep -v '^ ' | grep bwd
done
