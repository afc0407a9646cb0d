# Call D (H100): source-level ncu of the hd64 backward (non-causal, bf16, 4 x 4096 x 32 heads),
# flashgen's dK/dV kernel against FlashAttention-2's, for the next attempt at hd64 (issue 4):
# instruction classes, stall reasons, the hottest SASS lines of each (session 4's parsers).
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session6 P=notes/runs/2026-11-21-session4-bwd-dq
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
python3 -m flashgen generate --arch sm_90 --head-dim 64 --dtype bf16 --causal false --jobs 16 > $OUT/gen.log 2>&1; tail -1 $OUT/gen.log
timeout 300 ncu --section SourceCounters --section WarpStateStats --section InstructionStats \
  --section LaunchStats --section Occupancy --import-source no -k regex:"bwd_dkdv|flash_bwd_dq_dk_dv" -c 2 \
  -o /tmp/bwd64 python3 $N/prof_src.py bwd 0 64 > $OUT/ncu_log.txt 2>&1; echo "ncu rc $?"
ncu -i /tmp/bwd64.ncu-rep --page details --print-details all > $OUT/ncu_bwd64_details.txt 2>&1
ncu -i /tmp/bwd64.ncu-rep --page source --csv --print-source sass > /tmp/bwd64_src.csv 2>&1
(cd $P && python3 ncu_parse.py /tmp/bwd64_src.csv) > $OUT/ncu_bwd64_summary.txt 2>&1
for k in 0 1; do (cd $P && python3 ncu_hot.py /tmp/bwd64_src.csv $k 40); echo; done > $OUT/ncu_bwd64_hot.txt 2>&1
gzip -c /tmp/bwd64_src.csv > $OUT/bwd64_src.csv.gz
cat $OUT/ncu_bwd64_summary.txt
grep -E "Duration|Registers Per|Achieved Occupancy|Executed Ipc|Issue Slots Busy|No Eligible|Shared Memory Configuration Size|L1/TEX Hit|L2 Hit" $OUT/ncu_bwd64_details.txt
