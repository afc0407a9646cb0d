# Call F (H100): the committed grid's backward cells below 1.0x (hd64/hd128 at 2k-4k, hd256 full
# 2k), twice more each, bf16 and fp16, on the same tree (d68c3d7), with sweep_bwd.py (each cell
# timed as FLASH_ATTENTION, flashgen, FLASH_ATTENTION).
set -uo pipefail
R=$PWD S7=notes/runs/2026-11-23-session7
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
[ -d $FLASHGEN_CACHE_DIR/sm_90 ] || { mkdir -p $FLASHGEN_CACHE_DIR && tar xzf scratch/sm90-cache.tgz -C $FLASHGEN_CACHE_DIR; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
python3 -m flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --head-dim 256 --direction bwd --jobs 16 2>&1 | tail -1
CELLS="64:2048:1 64:4096:1 64:2048:0 64:4096:0 128:2048:1 128:4096:1 256:2048:0"
for rep in 1 2; do for dtype in bf16 fp16; do
  python3 $S7/sweep_bwd.py $dtype $CELLS 2>&1 | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
