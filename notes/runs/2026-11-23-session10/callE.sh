# Call E (H100): the whole GPU suite and compute-sanitizer on this tree (kernels built afresh if
# the machine is new):  bash notes/runs/2026-11-23-session10/callE.sh
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache
SKIP_BENCH=1 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider 2>&1 | tail -4
ls $OUT
