# Call D (H100): call C's slow split measurements at hd128 4k, under the profiler:
#   bash notes/runs/2026-11-23-session10/callD.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session10
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$R:/tmp/site
[ -d /tmp/site/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m flashgen generate --arch sm_90 --jobs 16 2>&1 | tail -1
for dtype in bf16 fp16; do
  python3 $N/diag_split.py $dtype 128 4096 2>&1 | grep -v -i warn
done | tee $OUT/diag.txt
