# Call E: backward variants (hd 64/128, bf16) against the committed kernel, in one call.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
declare -A P=([addr]="bwd_addr" [order]="bwd_order" [both]="bwd_addr bwd_order" [noatomic]="bwd_noatomic")
for v in addr order both noatomic; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
  for p in ${P[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/scratch/variants/$p.patch) || echo "patch $p failed"; done
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     --head-dim 64 --head-dim 128 --jobs 4 --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1) &
done
wait; grep -h "ready\|error" $OUT/gen_*.log | head
for v in main addr order both noatomic main2; do
  t=/tmp/t_$v; [ $v = main ] || [ $v = main2 ] && t=$R
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 100 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --head-dim 64 --head-dim 128 \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g')
done
