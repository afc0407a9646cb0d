# Call M: how dQ leaves shared memory, bf16 hd64/128, each timed twice (runs interleaved):
#   row   call I's kernel: per-row bulk adds, staging padded by 8, workspace rows unpadded
#   p4r16 one staging buffer padded by 4 (workspace too), bulk adds of 16 rows
#   u16   nothing padded (staging stores conflict 4-way), bulk adds of 16 rows
#   u64   nothing padded, one bulk add per step
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
declare -A P=([row]="bwd_bulk" [p4r16]="bwd_dbl single_buffer" [u16]="bwd_dbl single_buffer" [u64]="bwd_dbl single_buffer")
for v in row p4r16 u16 u64; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
  for p in ${P[$v]}; do (cd /tmp/t_$v && patch -s -p1 < $R/scratch/variants/$p.patch) || echo "patch $p failed"; done
  if [ $v = u16 ] || [ $v = u64 ]; then
    sed -i 's/kHeadDimPadded + 4;/kHeadDimPadded;/' /tmp/t_$v/templates/include/flashgen/bwd_traits.cuh
    sed -i 's/return padded_head_dim(head_dim) + 4/return padded_head_dim(head_dim)/' /tmp/t_$v/codegen/resources.py
  fi
  [ $v = u64 ] && sed -i 's/kDqRowsPerBulkAdd = 16;/kDqRowsPerBulkAdd = 64;/' /tmp/t_$v/templates/include/flashgen/bwd_traits.cuh
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     --head-dim 64 --head-dim 128 --jobs 4 --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1) &
done
wait; grep -h "ready\|rror" $OUT/gen_*.log | head
grep -c "kHeadDimPadded;" /tmp/t_u16/templates/include/flashgen/bwd_traits.cuh /tmp/t_u64/templates/include/flashgen/bwd_traits.cuh
(cd /tmp/t_u16 && PYTHONPATH=/tmp/t_u16:/tmp/site timeout 200 python3 $R/scratch/bwd_smoke.py 64 2>&1 | grep -E "FAIL")
for rep in 1 2; do for v in row p4r16 u16 u64; do
  t=/tmp/t_$v
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 150 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --seqlen 16384 --head-dim 64 --head-dim 128 \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
done; done
