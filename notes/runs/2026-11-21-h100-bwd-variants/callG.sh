# ncu instruction mix and stall reasons: flashgen vs FlashAttention-2, hd128 bf16 4096, fwd and bwd.
set -uo pipefail
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
timeout 400 ncu --section InstructionStats --section WarpStateStats --section ComputeWorkloadAnalysis \
  --print-details all -k regex:"fwd_kernel|flash_fwd_kernel|bwd_dkdv|flash_bwd_dq_dk_dv" -c 4 \
  python3 notes/runs/2026-11-21-h100-fwd-variants/prof_driver.py bwd > $OUT/ncu_mix.txt 2>&1
echo "ncu rc $?"; wc -l $OUT/ncu_mix.txt; grep -n -i "opcode\|stall\|  void" $OUT/ncu_mix.txt | head -30
