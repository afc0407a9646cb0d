# Call A (H100): the grid order. Builds the bf16 kernels of head dims 64/128/256 (forward and
# backward) and, from a copy of the tree with bwd_rotate.patch, the backward kernels whose key
# blocks start their query walk at staggered offsets; checks both against the fp32 reference
# under several orders; then sweeps ranks per round against FLASH_ATTENTION (causal, forward and
# backward) and times the rotated backward (non-causal and causal).
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session6
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
rm -rf /tmp/t_rot && mkdir /tmp/t_rot && cp -r codegen flashgen templates /tmp/t_rot/ \
  && (cd /tmp/t_rot && patch -s -p1 < $R/$N/bwd_rotate.patch) || exit 1
HD="--head-dim 64 --head-dim 128 --head-dim 256"
(PYTHONPATH=$R:/tmp/site python3 -m flashgen generate --arch sm_90 $HD --dtype bf16 --jobs 12 \
   > $OUT/gen_main.log 2>&1; echo "main generate rc $?") &
(cd /tmp/t_rot && PYTHONPATH=/tmp/t_rot:/tmp/site python3 -m flashgen generate --arch sm_90 $HD \
   --dtype bf16 --direction bwd --jobs 8 --out /tmp/gen_rot > $OUT/gen_rot.log 2>&1; echo "rot generate rc $?") &
wait
tail -1 $OUT/gen_main.log $OUT/gen_rot.log
main() { PYTHONPATH=$R:/tmp/site python3 "$@"; }
rot() { (cd /tmp/t_rot && PYTHONPATH=/tmp/t_rot:/tmp/site python3 "$@"); }
main $N/smoke_order.py 64,128,256 1,3 bf16 2>&1 | tee $OUT/smoke_main.txt | grep -E "FAIL|SMOKE"
rot $R/$N/smoke_order.py 64,128,256 4 bf16 2>&1 | tee $OUT/smoke_rot.txt | grep -E "FAIL|SMOKE"
ALL=512,1024,2048,4096,8192,16384
main $N/sweep_order.py fwd 64,128,256 $ALL old,1,2,4,8,1v 2>&1 | tee $OUT/sweep_fwd.txt
main $N/sweep_order.py bwd 64,128,256 $ALL old,1,2,4,8 2>&1 | tee $OUT/sweep_bwd.txt
main $N/sweep_order.py bwd 64,128,256 2048,4096,16384 old bf16 0 2>&1 | tee $OUT/sweep_bwd_full_main.txt
rot $R/$N/sweep_order.py bwd 64,128,256 2048,4096,16384 old bf16 0 2>&1 | tee $OUT/sweep_bwd_full_rot.txt
rot $R/$N/sweep_order.py bwd 64,128,256 2048,4096,16384 4 bf16 1 2>&1 | tee $OUT/sweep_bwd_causal_rot.txt
