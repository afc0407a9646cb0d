# Call E (H100): where the backward's next Q/dO loads are issued relative to the previous step's dQ
# adds (call D's ncu: warps wait for those loads at the loop top, 13% of stall samples at hd64).
#   main: loads for step s+1 at the top of step s, right after step s-1's adds;
#   A (bwd_dq_after_loads.patch): step s-1's dQ is added after step s issues its loads (held in
#     registers, or in the staging rows for bulk adds);
#   B (bwd_loads_mid_step.patch): the loads for step s+1 are issued after step s's mid barrier.
# bf16, head dims 64/128/256: correctness (smoke_order.py), then the backward against
# FLASH_ATTENTION, non-causal and causal, seqlen 2k/4k/16k, interleaved twice.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session6
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
for v in A B; do rm -rf /tmp/t_$v && mkdir /tmp/t_$v && cp -r codegen flashgen templates /tmp/t_$v/; done
(cd /tmp/t_A && patch -s -p1 < $R/$N/bwd_dq_after_loads.patch) || exit 1
(cd /tmp/t_B && patch -s -p1 < $R/$N/bwd_loads_mid_step.patch) || exit 1
HD="--head-dim 64 --head-dim 128 --head-dim 256 --dtype bf16"
gen() { (cd $1 && PYTHONPATH=$1:/tmp/site python3 -m flashgen generate --arch sm_90 $HD $2 --jobs 8 \
  --out /tmp/gen_$(basename $1) > $OUT/gen_$(basename $1).log 2>&1; echo "$1 generate rc $?"); }
gen $R "" & gen /tmp/t_A "--direction bwd" & gen /tmp/t_B "--direction bwd" & wait
run_in() { local t=$1; shift; (cd $t && PYTHONPATH=$t:/tmp/site python3 "$@"); }
run_in $R -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16.*built" | sed "s|^|main |" | tee $OUT/kernels.txt
for t in /tmp/t_A /tmp/t_B; do
  run_in $t -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16.*built" | sed "s|^|$(basename $t) |" | tee -a $OUT/kernels.txt
  run_in $t $R/$N/smoke_order.py 64,128,256 2 bf16 fwd,bwd 2>&1 | sed "s|^|$(basename $t) |" | tee -a $OUT/smoke.txt | grep -E "FAIL|SMOKE"
done
for rep in 1 2; do for t in $R /tmp/t_A /tmp/t_B; do
  v=$(basename $t); [ $t = $R ] && v=main
  for c in 0 1; do
    run_in $t $R/$N/sweep_order.py bwd 64,128,256 2048,4096,16384 old bf16 $c 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweepE.txt | grep SUMMARY
  done
done; done
