# Call J: dQ by one bulk reduce-add per step into a workspace of padded rows (bulk2), and bulk2
# with FlashAttention-2's hd64 tile (block_m 128): correctness smoke and bf16 timing.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
declare -A P=([bulk2]="bwd_bulk2" [t64]="bwd_bulk2 cfg_hd64_m128")
for v in bulk2 t64; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
  for p in ${P[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/scratch/variants/$p.patch) || echo "patch $p failed"; done
done
(cd /tmp/t_bulk2 && PYTHONPATH=/tmp/t_bulk2:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 \
   --head-dim 64 --head-dim 128 --head-dim 256 --jobs 12 --out /tmp/gen_bulk2 > $OUT/gen_bulk2.log 2>&1) &
(cd /tmp/t_t64 && PYTHONPATH=/tmp/t_t64:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
   --head-dim 64 --jobs 4 --out /tmp/gen_t64 > $OUT/gen_t64.log 2>&1) &
wait; grep -h "ready\|rror" $OUT/gen_*.log | head
grep -h -o '"registers": [0-9]*\|"spill_bytes": [0-9]*' /tmp/fgc/sm_90/bwd_sm90_bf16_hd64*/meta.json | paste - - | head
(cd /tmp/t_bulk2 && PYTHONPATH=/tmp/t_bulk2:/tmp/site timeout 200 python3 $R/scratch/bwd_smoke.py 64,128,256 2>&1 | tee $OUT/smoke_bulk2.txt | grep -E "FAIL|ratio")
(cd /tmp/t_t64 && PYTHONPATH=/tmp/t_t64:/tmp/site timeout 100 python3 $R/scratch/bwd_smoke.py 64 2>&1 | tee $OUT/smoke_t64.txt | grep -E "FAIL|ratio")
for v in main bulk2 t64; do
  t=/tmp/t_$v; [ $v = main ] && t=$R
  hds="--head-dim 64 --head-dim 128"; [ $v = t64 ] && hds="--head-dim 64"
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 150 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --seqlen 16384 $hds \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
done
