# Call B (H100): the mask split (M, call A's best) against the committed kernel and against
# M + dQ by bulk reduce-adds at hd64 too (MB: rows of 256 bytes allowed, DQ_BULK_ADD_MIN_ROW_BYTES
# 512 -> 256), interleaved twice; then ncu source counters of M's hd64 dK/dV kernel against
# FlashAttention-2's (call D of session 6, on the new kernel). Each tree builds into its own cache
# (one shared cache serialises the builds: call A).
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session7 S6=notes/runs/2026-11-23-session6 P=notes/runs/2026-11-21-session4-bwd-dq
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
for v in main M MB; do
  rm -rf /tmp/t_$v /tmp/fgc_$v && mkdir -p /tmp/t_$v /tmp/fgc_$v && cp -r codegen flashgen templates /tmp/t_$v/
  tar xzf scratch/sm90-cache.tgz -C /tmp/fgc_$v
done
(cd /tmp/t_M && patch -s -p1 < $R/$N/bwd_mask_split.patch) || exit 1
(cd /tmp/t_MB && patch -s -p1 < $R/$N/bwd_mask_split.patch) || exit 1
sed -i 's/^DQ_BULK_ADD_MIN_ROW_BYTES = 512/DQ_BULK_ADD_MIN_ROW_BYTES = 256/' /tmp/t_MB/codegen/resources.py
grep -q "^DQ_BULK_ADD_MIN_ROW_BYTES = 256" /tmp/t_MB/codegen/resources.py || exit 1
run_in() { local v=$1; shift; (cd /tmp/t_$v && FLASHGEN_CACHE_DIR=/tmp/fgc_$v PYTHONPATH=/tmp/t_$v:/tmp/site python3 "$@"); }
for v in main M MB; do
  (run_in $v -m flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --dtype bf16 --jobs 5 \
     --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1; echo "$v generate rc $?") &
done; wait
for v in main M MB; do
  run_in $v -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16_hd\(64\|128\).*built" | sed "s|^|$v |" | tee -a $OUT/kernels.txt
done
run_in MB $R/$S6/smoke_order.py 64 2 bf16,fp16 bwd 2>&1 | sed "s|^|MB |" | tee -a $OUT/smoke.txt | grep -E "FAIL|SMOKE"
CELLS="64:2048:0 64:4096:0 64:16384:0 64:2048:1 64:4096:1 64:16384:1 128:2048:1 128:4096:1"
for rep in 1 2; do for v in main M MB; do
  run_in $v $R/$N/sweep_bwd.py bf16 $CELLS 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
timeout 240 bash -c "cd /tmp/t_M && FLASHGEN_CACHE_DIR=/tmp/fgc_M PYTHONPATH=/tmp/t_M:/tmp/site ncu --section SourceCounters \
  --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy --import-source no \
  -k regex:'bwd_dkdv|flash_bwd_dq_dk_dv' -c 2 -o /tmp/bwd64 python3 $R/$S6/prof_src.py bwd 0 64" > $OUT/ncu_log.txt 2>&1
echo "ncu rc $?"
ncu -i /tmp/bwd64.ncu-rep --page source --csv --print-source sass > /tmp/bwd64_src.csv 2>&1
(cd $R/$P && python3 ncu_parse.py /tmp/bwd64_src.csv) > $OUT/ncu_bwd64_summary.txt 2>&1
for k in 0 1; do (cd $R/$P && python3 ncu_hot.py /tmp/bwd64_src.csv $k 40); echo; done > $OUT/ncu_bwd64_hot.txt 2>&1
gzip -c /tmp/bwd64_src.csv > $OUT/bwd64_src.csv.gz
head -40 $OUT/ncu_bwd64_summary.txt
