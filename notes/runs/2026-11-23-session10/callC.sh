# Call C (H100, warm from call B): the split sweep again where the model's gain is smallest
# (3-5 pieces at head dims 128 and 256, seqlen 2k-8k), twice per dtype:
#   bash notes/runs/2026-11-23-session10/callC.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session10
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$R:/tmp/site
[ -d /tmp/site/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m flashgen generate --arch sm_90 --jobs 16 2>&1 | tail -1
for dtype in bf16 fp16 bf16 fp16; do
  python3 $N/sweep_bwd_split.py $dtype 128:2048:0 128:4096:0 256:2048:0 256:8192:0 2>&1 | grep -v -i warn
done | tee $OUT/sweep.txt
