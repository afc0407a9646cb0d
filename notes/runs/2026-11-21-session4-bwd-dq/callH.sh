# Source-level ncu (SASS + per-instruction executed counts and stall samples): flashgen vs FA2,
# backward hd128 non-causal and forward hd128 causal, bf16 4096.
set -uo pipefail
mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
prof() {  # tag mode causal regex
  timeout 200 ncu --section SourceCounters --section WarpStateStats --section InstructionStats \
    --section LaunchStats --section Occupancy --import-source no -k regex:"$4" -c 2 -o /tmp/$1 \
    python3 scratch/prof_src.py $2 $3 > $OUT/$1_log.txt 2>&1
  echo "$1 ncu rc $?"
  ncu -i /tmp/$1.ncu-rep --page details --print-details all > $OUT/$1_details.txt 2>&1
  ncu -i /tmp/$1.ncu-rep --page source --csv --print-source sass > /tmp/$1_src.csv 2>&1
  echo "$1 src rc $? $(wc -c < /tmp/$1_src.csv)"
}
prof bwd bwd 0 "bwd_dkdv|flash_bwd_dq_dk_dv"
prof fwdc fwd 1 "fwd_kernel|flash_fwd_kernel"
cd /tmp && tar czf $OUT/src.tgz bwd_src.csv fwdc_src.csv && ls -la $OUT
head -c 1500 /tmp/bwd_src.csv
