# Device call A: forward variants (HEAD=v0, v1 copy_all_rows, v2 +lazy rescale, v3 +loop split)
# timed against FLASH_ATTENTION in separate processes, quick correctness of v2/v3, ncu profiles.
set -uo pipefail
R=$PWD
mkdir -p /tmp/fgc && for t in .fgcache.tgz scratch/var.tgz; do tar xzf $t -C /tmp/fgc; done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
mk() {  # tree for variant $1 at /tmp/t_$1
  rm -rf /tmp/t_$1 && mkdir /tmp/t_$1 && cp -r $R/codegen $R/flashgen $R/tests $R/scripts $R/pyproject.toml /tmp/t_$1/ 2>/dev/null
  cp -r $R/scratch/base/templates /tmp/t_$1/templates
  [ $1 = v0 ] || (cd /tmp/t_$1 && patch -s -p1 < $R/scratch/variants/$1.patch)
}
bench() {  # variant, tag
  (cd /tmp/t_$1 && PYTHONPATH=/tmp/t_$1:/tmp/site timeout 150 python3 -m flashgen bench --dtype bf16 --seqlen 4096 \
    --head-dim 64 --head-dim 128 --head-dim 256 --impl flashgen --impl FLASH_ATTENTION --mode fwd \
    --out $OUT/bench_$2 > $OUT/bench_$2.log 2>&1; echo "== $2"; grep -E "^ *(64|128|256)|ratio|x$" $OUT/bench_$2.log | head -20)
}
for v in v0 v1 v2 v3; do mk $v; done
bench v0 v0a; bench v1 v1; bench v2 v2; bench v3 v3; bench v0 v0b; bench v2 v2b
for v in v2 v3; do
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout 200 python3 -m pytest -q -x tests/gpu/test_forward.py tests/gpu/test_numerics.py \
     -k "bf16 and (hd64 or hd128 or hd256) or large or extreme or non_finite" 2>&1 | tail -3 | sed "s/^/$v pytest: /")
done
# ncu: flashgen (v2) and FLASH_ATTENTION forward hd128, flashgen (v0) and FLASH_ATTENTION backward hd128
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis"
(cd /tmp/t_v2 && PYTHONPATH=/tmp/t_v2:/tmp/site timeout 120 ncu $S -k regex:"fwd_kernel|flash_fwd_kernel" -c 2 \
   python3 $R/scratch/prof_driver.py fwd > $OUT/ncu_fwd.txt 2>&1; echo ncu fwd rc $?)
(cd /tmp/t_v0 && PYTHONPATH=/tmp/t_v0:/tmp/site timeout 150 ncu $S -k regex:"bwd_dkdv|flash_bwd_dq_dk_dv" -c 2 \
   python3 $R/scratch/prof_driver.py bwd > $OUT/ncu_bwd.txt 2>&1; echo ncu bwd rc $?)
grep -E "^  [a-z_:]+.*(fwd_kernel|bwd_dkdv|flash_)|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Local Memory|Stall" $OUT/ncu_*.txt | cut -c1-160 | head -60
