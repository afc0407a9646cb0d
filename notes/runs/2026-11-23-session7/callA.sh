# Call A (H100): the hd64 backward's step, four variants against the committed kernel.
#   M   (bwd_mask_split.patch): the step compiled once masked, once not, chosen per tile; call F's
#       SASS ran 128 predicated FSEL/PLOP3 per thread per step with no tile masked;
#   MO  (bwd_mask_split_dq_first.patch): M + dQ's GEMM and adds before dK's GEMM (FA2's order);
#   MOP (bwd_p_first_half.patch): MO + P computed and stored before dP's GEMM, kept in the input
#       type for dS (fewer live registers);
#   MOF (bwd_p_first_fp32.patch): MO + the same order with P kept in fp32.
# bf16 hd 64/128: ptxas report and SASS opcode counts, correctness (smoke_order.py), then
# interleaved backward sweeps (sweep_bwd.py), twice. Stages: build (the first call, which ran out of
# time after it: builds of one cache directory take turns), then time on the still-warm machine.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session7 S6=notes/runs/2026-11-23-session6
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
mkdir -p /tmp/fgc && [ -f scratch/sm90-cache.tgz ] && tar xzf scratch/sm90-cache.tgz -C /tmp/fgc
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
declare -A PATCH=([M]=bwd_mask_split [MO]=bwd_mask_split_dq_first [MOP]=bwd_p_first_half [MOF]=bwd_p_first_fp32)
for v in "${!PATCH[@]}"; do
  rm -rf /tmp/t_$v && mkdir /tmp/t_$v && cp -r codegen flashgen templates /tmp/t_$v/
  (cd /tmp/t_$v && patch -s -p1 < $R/$N/${PATCH[$v]}.patch) || exit 1
done
stage=${1:-build}
TREES="main:$R M:/tmp/t_M MO:/tmp/t_MO MOP:/tmp/t_MOP MOF:/tmp/t_MOF"
run_in() { local t=$1; shift; (cd $t && PYTHONPATH=$t:/tmp/site python3 "$@"); }
if [ $stage = build ]; then
HD="--head-dim 64 --head-dim 128 --dtype bf16"
gen() { (cd $1 && PYTHONPATH=$1:/tmp/site python3 -m flashgen generate --arch sm_90 $HD $2 --jobs 4 \
  --out /tmp/gen_$3 > $OUT/gen_$3.log 2>&1; echo "$3 generate rc $?"); }
gen $R "" main & for v in M MO MOP MOF; do gen /tmp/t_$v "--direction bwd" $v & done; wait
for vt in $TREES; do v=${vt%%:*} t=${vt#*:}
  run_in $t -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16.*built" | sed "s|^|$v |" | tee -a $OUT/kernels.txt
  so=$(run_in $t -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16_hd64_full.*built" | awk '{print $NF}')/kernel.so
  cuobjdump -sass $so | awk '/Function : .*bwd_dkdv/{on=1} /Function : .*bwd_dq_kernel/{on=0} on' > /tmp/sass_$v.txt
  echo "$v hd64 full dkdv: $(for op in HMMA FSEL PLOP3 LDL STL REDG MUFU.EX2 BAR.SYNC; do printf '%s=%s ' $op $(grep -c "$op" /tmp/sass_$v.txt); done)" | tee -a $OUT/sass_counts.txt
done
else
CELLS="64:2048:0 64:4096:0 64:16384:0 64:2048:1 64:4096:1 64:16384:1 128:2048:1 128:4096:1 128:4096:0"
for rep in 1 2; do for vt in $TREES; do v=${vt%%:*} t=${vt#*:}
  run_in $t $R/$N/sweep_bwd.py bf16 $CELLS 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
for vt in $TREES; do v=${vt%%:*} t=${vt#*:}
  dts=bf16; [ $v = MOP ] && dts=bf16,fp16
  run_in $t $R/$S6/smoke_order.py 64,128 2 $dts bwd 2>&1 | sed "s|^|$v |" | tee -a $OUT/smoke.txt | grep -E "FAIL|SMOKE"
done
fi
