# Final calls on one warm machine: `tests`, `sanitize`, `grid` (scripts/ do the work).
set -uo pipefail
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do [ -f $t ] && tar xzf $t -C /tmp/fgc; done; fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
case $1 in
tests)
  SKIP_BENCH=1 SKIP_SANITIZE=1 timeout 480 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider
  grep -c built $OUT/generate.log; python3 -m flashgen list --arch sm_90 > $OUT/kernels.txt 2>&1
  timeout 60 python3 scripts/host_overhead.py > $OUT/host_overhead.txt 2>&1; tail -25 $OUT/host_overhead.txt
  timeout 60 python3 -m flashgen bench --overhead 2>&1 | tee $OUT/overhead.txt
  timeout 200 python3 -m flashgen bench --batch 1 --heads 8 --mode fwd --dtype bf16 --impl flashgen \
    --impl flashgen_main_tile --impl flashgen_variant_tile --impl FLASH_ATTENTION --out /tmp/dispatch \
    > $OUT/dispatch.log 2>&1; cp /tmp/dispatch/results.json $OUT/dispatch.json; grep -v "^ " $OUT/dispatch.log | tail -40 ;;
dispatch)
  timeout 300 python3 -m flashgen bench $2 --out $OUT/dispatch 2>&1 | tee $OUT/dispatch.log | grep -v "^ " ;;
sanitize)
  OUT=$OUT timeout 560 bash scripts/sanitize.sh ;;
grid)
  OUT=$OUT timeout 570 bash scripts/bench_grid.sh ;;
esac
