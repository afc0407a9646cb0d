# Call I: backward dQ by bulk reduce-add (bulk) and a timing-only kernel without dQ atomics
# (noatomic2: the earlier noatomic patch still ran the row-checked atomics), bf16 hd64/128.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
for v in bulk noatomic2; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
  (cd /tmp/t_$v && patch -s -p1 < $R/scratch/variants/bwd_$v.patch) || echo "patch $v failed"
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     --head-dim 64 --head-dim 128 --jobs 8 --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1) &
done
wait; grep -h "ready\|rror" $OUT/gen_*.log | head
(cd /tmp/t_bulk && PYTHONPATH=/tmp/t_bulk:/tmp/site timeout 150 python3 $R/scratch/bwd_smoke.py 64,128 2>&1 | tee $OUT/smoke_bulk.txt | grep -E "FAIL|ratio")
for v in main bulk noatomic2 main2; do
  t=/tmp/t_$v; [ $v = main ] || [ $v = main2 ] && t=$R
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 150 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --seqlen 16384 --head-dim 64 --head-dim 128 \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
done
