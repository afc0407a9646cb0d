# Call B and call H (H100): the committed grid (scripts/bench_grid.sh) on this tree, kernels from call A's
# cache (scratch/s9-cache.tgz.*; generate only checks them):  bash notes/runs/2026-11-23-session9/callB.sh
set -uo pipefail
R=$PWD
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
start=$(date +%s)
python3 -m flashgen generate --arch sm_90 --jobs 16 > /tmp/generate.log 2>&1 || { tail -30 /tmp/generate.log; exit 1; }
echo "generate: $(( $(date +%s) - start )) s"
bash scripts/bench_grid.sh
