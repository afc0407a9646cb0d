# Call K: rows per bulk add of dQ (1, 8, 16; 64 was call J's bulk2), and block_m 128 at hd64.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
declare -A P=([bulk1]="bwd_bulk1" [bulk8]="bwd_bulk8" [bulk16]="bwd_bulk16" [t64b]="bwd_bulk8 cfg_hd64_m128")
for v in bulk1 bulk8 bulk16 t64b; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
  for p in ${P[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/scratch/variants/$p.patch) || echo "patch $p failed"; done
  hds="--head-dim 64 --head-dim 128"; [ $v = t64b ] && hds="--head-dim 64"
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     $hds --jobs 4 --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1) &
done
wait; grep -h "ready\|rror" $OUT/gen_*.log | head
(cd /tmp/t_bulk8 && PYTHONPATH=/tmp/t_bulk8:/tmp/site timeout 200 python3 $R/scratch/bwd_smoke.py 64,128 2>&1 | tee $OUT/smoke_bulk8.txt | grep -E "FAIL|ratio")
for v in bulk1 bulk8 bulk16 t64b; do
  t=/tmp/t_$v
  hds="--head-dim 64 --head-dim 128"; [ $v = t64b ] && hds="--head-dim 64"
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 150 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --seqlen 16384 $hds \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
done
