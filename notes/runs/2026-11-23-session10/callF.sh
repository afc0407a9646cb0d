# Call F (H100): the committed benchmark grid (scripts/bench_grid.sh) on this tree, kernels
# built first if the machine is new (the grid's head dims only):  bash notes/runs/2026-11-23-session10/callF.sh
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
[ -d /tmp/site/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
python3 -m flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --head-dim 256 --jobs 16 2>&1 | tail -1
bash scripts/bench_grid.sh > /dev/null 2>&1
grep -c "" $OUT/bench.log; tail -20 $OUT/overhead.txt; tail -5 $OUT/memory.txt
