# Call L: two dQ staging buffers (dbl) against one (single), bulk adds of 16 rows, bf16 hd64/128;
# and hd256 with q_stages 1, which makes room for one staging buffer (s256), against main.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
declare -A P=([dbl]="bwd_dbl" [single]="bwd_dbl single_buffer" [s256]="bwd_dbl cfg_hd256_s1")
declare -A H=([dbl]="--head-dim 64 --head-dim 128" [single]="--head-dim 64 --head-dim 128" [s256]="--head-dim 256")
for v in dbl single s256; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
  for p in ${P[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/scratch/variants/$p.patch) || echo "patch $p failed"; done
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     ${H[$v]} --jobs 5 --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1) &
done
wait; grep -h "ready\|rror" $OUT/gen_*.log | head
grep -h -o '"name": "bwd[a-z0-9_]*\|"spill_bytes": [0-9]*' /tmp/fgc/sm_90/bwd_sm90_bf16_hd*/meta.json | paste - - | sort | uniq | head -30
(cd /tmp/t_dbl && PYTHONPATH=/tmp/t_dbl:/tmp/site timeout 200 python3 $R/scratch/bwd_smoke.py 64,128 2>&1 | tee $OUT/smoke_dbl.txt | grep -E "FAIL|ratio")
(cd /tmp/t_s256 && PYTHONPATH=/tmp/t_s256:/tmp/site timeout 200 python3 $R/scratch/bwd_smoke.py 256 2>&1 | tee $OUT/smoke_s256.txt | grep -E "FAIL|ratio")
for v in dbl single s256 main; do
  t=/tmp/t_$v; hds=${H[$v]:-"--head-dim 256"}; [ $v = main ] && t=$R
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 150 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --seqlen 16384 $hds \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
done
