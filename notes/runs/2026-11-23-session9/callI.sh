# Call I (H100): ncu of the hd128 causal dK/dV kernels, flashgen's and FlashAttention-2's, at
# seqlen 8k and 16k (why FlashAttention-2 gains 7% from 8k to 16k there and flashgen 2-3%):
#   bash notes/runs/2026-11-23-session9/callI.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session9
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
for seqlen in 8192 16384; do
  timeout 200 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats -k regex:'bwd_dkdv|flash_bwd_dq_dk_dv' -c 2 \
    python3 $N/prof_bwd_causal.py $seqlen > $OUT/ncu_hd128_causal_$seqlen.txt 2>&1
  echo "ncu $seqlen rc $?"
  grep -E "bwd_dkdv|flash_bwd|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|DRAM Throughput|Warp Cycles Per Issued|Achieved Occupancy|Grid Size" $OUT/ncu_hd128_causal_$seqlen.txt | sed 's/  */ /g' | cut -c1-150
done
