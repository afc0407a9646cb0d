# Call B (H100, the machine of call A while warm): the backward grid at seqlen 2k-16k three times
# (flashgen and FLASH_ATTENTION, both dtypes), the hd64 4k/8k split sweep again (call A's
# outlier), and the kernels built from this tree (files from the last hour) in pieces:
#   bash notes/runs/2026-11-23-session10/callB.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session10
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
if [ ! -d $FLASHGEN_CACHE_DIR/sm_90 ]; then  # a fresh machine
  mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
fi
python3 -m flashgen generate --arch sm_90 --jobs 16 > $OUT/generate.log 2>&1 || { tail -30 $OUT/generate.log; exit 1; }
tail -1 $OUT/generate.log
for run in 1 2 3; do
  mkdir -p /tmp/run$run
  python3 -m flashgen bench --mode bwd --head-dim 64 --head-dim 128 --head-dim 256 --seqlen 2048 \
    --seqlen 4096 --seqlen 8192 --seqlen 16384 --impl flashgen --impl FLASH_ATTENTION \
    --out /tmp/run$run 2>&1 | grep -v '^ ' | grep bwd > /tmp/run$run/bench.log
  cp /tmp/run$run/results.json $OUT/run$run.json
done
python3 notes/runs/2026-11-23-session9/runs_per_cell.py $OUT/run1.json $OUT/run2.json $OUT/run3.json \
  | tee $OUT/runs_per_cell.txt | tail -2
for dtype in bf16 fp16; do
  python3 $N/sweep_bwd_split.py $dtype 64:4096:0 64:8192:0 64:4096:0 2>&1 | grep -v -i warn
done | tee $OUT/sweep.txt
(cd $FLASHGEN_CACHE_DIR && find . -type f -mmin -60 | tar czf - -T -) | split -b 15M - $OUT/s10-cache.tgz.
ls -la $OUT
