# Call B (H100): the forward with rounds of 2 ranks (the committed grid order) in three kernel
# versions: v0 as committed before this call, v1 = v0 + warps skip the diagonal tiles they cannot
# see (fwd_skip.patch), v2 = v1 + each warp owns consecutive query rows (fwd_rowslab.patch; the
# working tree). Checks v2 against the fp32 reference, then times causal (all three) and
# non-causal (v0, v2) cells against FLASH_ATTENTION, interleaved.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session6
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
for v in v1 v0; do rm -rf /tmp/t_$v && mkdir /tmp/t_$v && cp -r codegen flashgen templates /tmp/t_$v/; done
(cd /tmp/t_v1 && patch -s -R -p1 < $R/$N/fwd_rowslab.patch) || exit 1
(cd /tmp/t_v0 && patch -s -R -p1 < $R/$N/fwd_rowslab.patch && patch -s -R -p1 < $R/$N/fwd_skip.patch) || exit 1
gen() {  # tree, extra args
  (cd $1 && PYTHONPATH=$1:/tmp/site python3 -m flashgen generate --arch sm_90 --direction fwd \
     --head-dim 64 --head-dim 128 --head-dim 256 --dtype bf16 --jobs 10 --out /tmp/gen_$(basename $1) $2 \
     > $OUT/gen_$(basename $1).log 2>&1; echo "$1 generate rc $?")
}
gen $R "" & gen /tmp/t_v0 "" & gen /tmp/t_v1 "--causal true" & wait
(cd $R && PYTHONPATH=$R:/tmp/site python3 -m flashgen list --arch sm_90 --direction fwd 2>&1 | grep bf16_hd | tee $OUT/kernels_v2.txt)
run_in() { local t=$1; shift; (cd $t && PYTHONPATH=$t:/tmp/site python3 "$@"); }
run_in $R $R/$N/smoke_order.py 64,128,256 2,1 bf16 fwd 2>&1 | tee $OUT/smoke_v2.txt | grep -E "FAIL|SMOKE"
ALL=512,1024,2048,4096,8192,16384
for t in /tmp/t_v0 $R /tmp/t_v1 $R /tmp/t_v0; do
  v=$(basename $t); [ $t = $R ] && v=v2
  run_in $t $R/$N/sweep_order.py fwd 64,128,256 $ALL 2 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweepB_causal.txt | grep SUMMARY
done
for t in /tmp/t_v0 $R /tmp/t_v0 $R; do
  v=$(basename $t); [ $t = $R ] && v=v2
  run_in $t $R/$N/sweep_order.py fwd 64,128,256 2048,4096,16384 old bf16 0 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweepB_full.txt | grep SUMMARY
done
