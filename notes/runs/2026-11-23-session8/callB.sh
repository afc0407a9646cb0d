# Call B (H100): call A's best (WE: S/dP split with more warps along M on a tie, the epilogue's
# read-only wait) plus D (bwd_softmax_d_lanes.patch: D = rowsum(dO * O) with a row per 8 lanes
# at hd64, not per warp), and WEKD (the tie rule for dK/dV too: call A's WEK, noise so far),
# against the committed kernel; bf16 twice, fp16 once, interleaved. nvidia-smi samples clocks
# and power throughout; diag.py compares event-timed medians with kernel sums.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session8 S6=notes/runs/2026-11-23-session6 S7=notes/runs/2026-11-23-session7
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv | tee $OUT/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 250 > /tmp/smi.csv 2>&1 &
SMI=$!
declare -A PATCHES=([main]="" [WED]="bwd_epilogue_read_wait bwd_sdp_rows_on_tie bwd_softmax_d_lanes"
                    [WEKD]="bwd_epilogue_read_wait bwd_sdp_dkv_rows_on_tie bwd_softmax_d_lanes")
declare -A HDS=([main]="--head-dim 64 --head-dim 128" [WED]="--head-dim 64 --head-dim 128" [WEKD]="--head-dim 128")
VARIANTS="main WED WEKD"
for v in $VARIANTS; do
  rm -rf /tmp/t_$v && mkdir -p /tmp/t_$v && cp -r codegen flashgen templates /tmp/t_$v/
  [ -d /tmp/fgc_$v ] || { mkdir -p /tmp/fgc_$v && tar xzf scratch/sm90-cache.tgz -C /tmp/fgc_$v; }
  for p in ${PATCHES[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/$N/$p.patch) || exit 1; done
done
run_in() { local v=$1; shift; (cd /tmp/t_$v && FLASHGEN_CACHE_DIR=/tmp/fgc_$v PYTHONPATH=/tmp/t_$v:/tmp/site python3 "$@"); }
for v in $VARIANTS; do
  (run_in $v -m flashgen generate --arch sm_90 ${HDS[$v]} --direction bwd --jobs 4 --out /tmp/gen_$v > /tmp/gen_$v.log 2>&1
   run_in $v -m flashgen generate --arch sm_90 --head-dim 256 --dtype bf16 --direction bwd --jobs 2 --out /tmp/gen_$v >> /tmp/gen_$v.log 2>&1
   echo "$v generate rc $? $(tail -1 /tmp/gen_$v.log)") &
  BUILDS="${BUILDS:-} $!"
done; wait $BUILDS  # not the nvidia-smi sampler
for v in $VARIANTS; do
  run_in $v -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "hd\(64\|128\|256\).*built" | sed "s|^|$v |"
done > $OUT/kernels.txt
run_in WED $R/$S6/smoke_order.py 64,128 1 bf16,fp16 bwd 2>&1 | sed "s|^|WED |" | tee $OUT/smoke.txt | grep -E "FAIL|SMOKE"
run_in WED $R/$S6/smoke_order.py 256 1 bf16 bwd 2>&1 | sed "s|^|WED |" | tee -a $OUT/smoke.txt | grep -E "FAIL|SMOKE"
BOTH="64:2048:0 64:4096:0 64:8192:0 64:2048:1 64:4096:1 64:8192:1"
KV="128:2048:1 128:4096:1 128:8192:1 128:2048:0"
BF16ONLY="256:2048:1 256:4096:0"
for pass in bf16 fp16 bf16; do for v in $VARIANTS; do
  cells="$BOTH $KV"; [ $v = WEKD ] && cells="$KV"
  [ $pass = bf16 ] && cells="$cells $BF16ONLY"
  run_in $v $R/$S7/sweep_bwd.py $pass $cells 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
for v in main WED; do
  run_in $v $R/$N/diag.py bf16 64:2048:0 128:2048:1 2>&1 | grep -v Warn | sed "s/^/$v /" | tee -a $OUT/diag.txt
done
kill $SMI; gzip -c /tmp/smi.csv > $OUT/smi.csv.gz
awk -F', ' '{print $2}' /tmp/smi.csv | sort | uniq -c | sort -rn | head -8
