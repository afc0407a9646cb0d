# Call A (H100): three changes to the backward against the committed kernel (5da7d4a), bf16,
# interleaved twice:
#   E   (bwd_epilogue_read_wait.patch): the epilogue waits for the last bulk dQ adds to read
#       their staging rows, at the very end, instead of for the adds to finish before dK and dV;
#   WE  E + bwd_sdp_rows_on_tie.patch: S and dP split with more warps along M on a tie (hd64's
#       128 x 128: 32 x 64 per warp, not 64 x 32; ptxas: spill 44 -> 0 bytes);
#   WEK WE + the same rule for dK and dV (hd128: 32 x 64 per warp, FlashAttention-2's split).
# Then: kernel-by-kernel time of both backwards (breakdown.py), and the SASS opcode counts of
# the committed hd64 dK/dV kernel's conversions.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session8 S6=notes/runs/2026-11-23-session6 S7=notes/runs/2026-11-23-session7
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
declare -A PATCHES=([main]="" [E]="bwd_epilogue_read_wait" [WE]="bwd_epilogue_read_wait bwd_sdp_rows_on_tie"
                    [WEK]="bwd_epilogue_read_wait bwd_sdp_dkv_rows_on_tie")
VARIANTS="main E WE WEK"
for v in $VARIANTS; do
  rm -rf /tmp/t_$v /tmp/fgc_$v && mkdir -p /tmp/t_$v /tmp/fgc_$v && cp -r codegen flashgen templates /tmp/t_$v/
  tar xzf scratch/sm90-cache.tgz -C /tmp/fgc_$v
  for p in ${PATCHES[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/$N/$p.patch) || exit 1; done
done
run_in() { local v=$1; shift; (cd /tmp/t_$v && FLASHGEN_CACHE_DIR=/tmp/fgc_$v PYTHONPATH=/tmp/t_$v:/tmp/site python3 "$@"); }
for v in $VARIANTS; do
  (run_in $v -m flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --head-dim 256 --dtype bf16 \
     --direction bwd --jobs 4 --out /tmp/gen_$v > /tmp/gen_$v.log 2>&1; echo "$v generate rc $? $(tail -1 /tmp/gen_$v.log)") &
done; wait
for v in $VARIANTS; do
  run_in $v -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16_hd\(64\|128\|256\).*built" | sed "s|^|$v |"
done | tee $OUT/kernels.txt
for v in E WE WEK; do
  run_in $v $R/$S6/smoke_order.py 64,128,256 1 bf16 bwd 2>&1 | sed "s|^|$v |" | tee -a $OUT/smoke.txt | grep -E "FAIL|SMOKE"
done
CELLS="64:2048:0 64:4096:0 64:16384:0 64:2048:1 64:4096:1 64:16384:1 128:2048:1 128:4096:1 128:4096:0 256:4096:0 256:2048:1"
for rep in 1 2; do for v in $VARIANTS; do
  run_in $v $R/$S7/sweep_bwd.py bf16 $CELLS 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
run_in main $R/$N/breakdown.py bf16 64:2048:0 64:16384:0 128:2048:1 128:4096:0 > $OUT/breakdown.txt 2>&1
so=$(grep "bwd_sm90_bf16_hd64_full" $OUT/kernels.txt | grep "^main" | awk '{print $NF}')
cuobjdump -sass $so/kernel.so | awk '/Function :.*dkdv/{k=1} /Function :.*(dq_kernel|softmax_d|convert)/{k=0} k && /^ +\/\*[0-9a-f]+\*\//{op=$2; if (op ~ /^@/) op=$3; print op}' \
  | sed 's/\..*//; s/;//' | sort | uniq -c | sort -rn > $OUT/sass_hd64_ops.txt 2>&1
head -30 $OUT/sass_hd64_ops.txt
