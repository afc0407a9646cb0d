# Calls C (H100): the committed tree's checks, one stage per call (each fits the 10-minute limit).
# The kernels come from scratch/sm90-cache.tgz when it is there: every default sm_90 kernel
# compiled on the 2-core machine with the same nvcc 13.0 (the cache key matches), so no call
# compiles them. Without it, the tests stage compiles them (scripts/gpu_check.sh).
#   bash callC.sh tests      # scripts/gpu_check.sh without bench and sanitizer: the GPU suite
#   bash callC.sh sanitize   # scripts/sanitize.sh: memcheck, racecheck, initcheck
#   bash callC.sh grid       # scripts/bench_grid.sh: the committed grid, memory, host overhead
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
if [ ! -d $FLASHGEN_CACHE_DIR/sm_90 ] && [ -f scratch/sm90-cache.tgz ]; then
  mkdir -p $FLASHGEN_CACHE_DIR && tar xzf scratch/sm90-cache.tgz -C $FLASHGEN_CACHE_DIR
fi
case $1 in
  tests)
    SKIP_BENCH=1 SKIP_SANITIZE=1 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider
    PYTHONPATH=$PWD:/tmp/site python3 -m flashgen list --arch sm_90 > $OUT/kernels.txt 2>&1 ;;
  sanitize|grid)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
    export PYTHONPATH=$PWD:/tmp/site
    if [ $1 = sanitize ]; then bash scripts/sanitize.sh; else bash scripts/bench_grid.sh; fi ;;
esac
