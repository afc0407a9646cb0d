# Call O (H100): dQ bulk adds issued from warps 0-1 (rowlike) against spread over all warps (cur),
# and per-thread atomics (atomics), bf16 hd64/128/256, two interleaved runs.
set -uo pipefail
R=$PWD
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
for v in rowlike atomics; do
  rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/
done
sed -i 's/const bool issues_bulk_add = tid % kThreadsPerGroup == 0;/const bool issues_bulk_add = tid < Traits::kDqGroups;/; s/const int dq_group = tid \/ kThreadsPerGroup;/const int dq_group = tid;/' /tmp/t_rowlike/templates/include/flashgen/bwd_kernel.cuh
grep -c "tid < Traits::kDqGroups" /tmp/t_rowlike/templates/include/flashgen/bwd_kernel.cuh
sed -i 's/bulk_reduce=True/bulk_reduce=False/' /tmp/t_atomics/codegen/arch.py
for v in rowlike atomics; do
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     --head-dim 64 --head-dim 128 --head-dim 256 --jobs 8 --out /tmp/gen_$v > $OUT/gen_$v.log 2>&1) &
done
wait; grep -h "ready\|rror" $OUT/gen_*.log | head
for rep in 1 2; do for v in cur rowlike atomics; do
  t=/tmp/t_$v; [ $v = cur ] && t=$R
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 100 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --seqlen 16384 --head-dim 64 --head-dim 128 --head-dim 256 \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$v |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
done; done
