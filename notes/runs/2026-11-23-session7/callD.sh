# Call D (H100): on the committed tree (bulk dQ adds at hd64 now), two orders of the step's tail
# that call A measured on the atomics path only, against it; interleaved twice, bf16:
#   LM (bwd_bulk_loads_mid_step.patch): next Q/dO loads after the mid-step barrier on the bulk
#       path too (session 6 kept them at the loop top there, measured at hd128);
#   OB (bwd_dq_before_dk.patch): dQ's GEMM and staging before dK's GEMM.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session7
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
declare -A PATCH=([LM]=bwd_bulk_loads_mid_step [OB]=bwd_dq_before_dk)
for v in main LM OB; do
  rm -rf /tmp/t_$v /tmp/fgc_$v && mkdir -p /tmp/t_$v /tmp/fgc_$v && cp -r codegen flashgen templates /tmp/t_$v/
  tar xzf scratch/sm90-cache.tgz -C /tmp/fgc_$v
  [ $v = main ] || (cd /tmp/t_$v && patch -s -p1 < $R/$N/${PATCH[$v]}.patch) || exit 1
done
run_in() { local v=$1; shift; (cd /tmp/t_$v && FLASHGEN_CACHE_DIR=/tmp/fgc_$v PYTHONPATH=/tmp/t_$v:/tmp/site python3 "$@"); }
for v in main LM OB; do
  (run_in $v -m flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --dtype bf16 --direction bwd \
     --jobs 5 > /tmp/gen_$v.log 2>&1; echo "$v generate rc $? $(tail -1 /tmp/gen_$v.log)") &
done; wait
for v in main LM OB; do
  run_in $v -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16_hd\(64\|128\).*built" | sed "s|^|$v |"
done | tee $OUT/kernels.txt
run_in OB $R/notes/runs/2026-11-23-session6/smoke_order.py 64,128 2 bf16 bwd 2>&1 | sed "s|^|OB |" | tee $OUT/smoke.txt | grep -E "FAIL|SMOKE"
run_in LM $R/notes/runs/2026-11-23-session6/smoke_order.py 64,128 2 bf16 bwd 2>&1 | sed "s|^|LM |" | tee -a $OUT/smoke.txt | grep -E "FAIL|SMOKE"
CELLS="64:2048:0 64:4096:0 64:16384:0 64:2048:1 64:4096:1 64:16384:1 128:2048:1 128:4096:1 128:4096:0"
for rep in 1 2; do for v in main LM OB; do
  run_in $v $R/$N/sweep_bwd.py bf16 $CELLS 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
