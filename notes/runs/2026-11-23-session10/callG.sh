# Call G (H100): the split sweep at the short cells where schedule.split_tail splits (hd64 non-causal
# seqlen 512 and 1k, 4 and 8 steps per block), twice per dtype:
#   bash notes/runs/2026-11-23-session10/callG.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session10
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
[ -d /tmp/site/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
python3 -m flashgen generate --arch sm_90 --head-dim 64 --causal false --jobs 16 2>&1 | tail -1
for dtype in bf16 fp16 bf16 fp16; do
  python3 $N/sweep_bwd_split.py $dtype 64:512:0 64:1024:0 64:2048:0 2>&1 | grep -v -i warn
done | tee $OUT/sweep.txt
