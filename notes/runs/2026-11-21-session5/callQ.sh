# Call Q (H100): forward hd128 variants (chunk-pipelined GEMM operand loads, block_n 32 tiles,
# split masked loop), and the pipelined GEMM in the backward; bf16.
set -uo pipefail
R=$PWD
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
[ -d /tmp/fgc/sm_90 ] || { mkdir -p /tmp/fgc; tar xzf scratch/fwd.tgz -C /tmp/fgc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
for v in pipe n32 n32s3 split; do rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/; done
for v in pipe split; do cp scratch/variants/gemm_pipe.cuh /tmp/t_$v/templates/include/flashgen/gemm.cuh; done
sed -i 's/^SPLIT_MASKED_LOOP_MAX_ACCUMULATORS = 160/SPLIT_MASKED_LOOP_MAX_ACCUMULATORS = 192/' /tmp/t_split/codegen/resources.py
tile128() {  # $1 tree, $2 block_n, $3 kv_stages: the sm_90 hd128 forward main tile
  python3 - "$@" <<'PY'
import re, sys
p = sys.argv[1] + "/codegen/configs/default.toml"; s = open(p).read()
s = s.replace("[arch.sm_90.head_dim.128]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2",
              f"[arch.sm_90.head_dim.128]\nblock_m = 128\nblock_n = {sys.argv[2]}\nwarps = 4\nkv_stages = {sys.argv[3]}")
open(p, "w").write(s); print(sys.argv[1], "ok" if f"block_n = {sys.argv[2]}\nwarps = 4\nkv_stages = {sys.argv[3]}" in s else "PATCH FAILED")
PY
}
tile128 /tmp/t_n32 32 2; tile128 /tmp/t_n32s3 32 3
gen() { (cd $1 && PYTHONPATH=$1:/tmp/site python3 -m flashgen generate --arch sm_90 --dtype bf16 $2 --jobs 6 --out /tmp/gen_$(basename $1) > $OUT/gen_$(basename $1)_$3.log 2>&1); }
gen $R "--direction bwd --head-dim 64 --head-dim 128" bwd &
gen /tmp/t_pipe "--head-dim 64 --head-dim 128" all &
gen /tmp/t_n32 "--direction fwd --head-dim 128" fwd &
gen /tmp/t_n32s3 "--direction fwd --head-dim 128" fwd &
gen /tmp/t_split "--direction fwd --head-dim 128" fwd &
wait; grep -h "ready\|rror\|spill" $OUT/gen_*.log | head -40
(cd /tmp/t_pipe && PYTHONPATH=/tmp/t_pipe:/tmp/site timeout 120 python3 $R/scratch/fwd_smoke.py 64,128 bf16 2>&1 | tail -5 | sed 's/^/pipe /' | tee $OUT/smoke.txt)
(cd /tmp/t_split && PYTHONPATH=/tmp/t_split:/tmp/site timeout 60 python3 $R/scratch/fwd_smoke.py 128 bf16 2>&1 | tail -5 | sed 's/^/split /' | tee -a $OUT/smoke.txt)
(cd /tmp/t_n32 && PYTHONPATH=/tmp/t_n32:/tmp/site timeout 60 python3 $R/scratch/fwd_smoke.py 128 bf16 2>&1 | tail -5 | sed 's/^/n32 /' | tee -a $OUT/smoke.txt)
(cd /tmp/t_pipe && PYTHONPATH=/tmp/t_pipe:/tmp/site timeout 150 python3 $R/scratch/bwd_smoke.py 64,128 2>&1 | grep -E "FAIL|ratio" | sed 's/^/pipe /' | tee -a $OUT/smoke.txt)
bench() {  # $1 name, $2 tree, $3.. bench args
  local n=$1 t=$2; shift 2
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 120 python3 -m flashgen bench --dtype bf16 --impl flashgen --impl FLASH_ATTENTION "$@" 2>&1 \
     | grep -E "x$" | sed "s|^|$n |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
}
for rep in 1 2; do for v in base pipe n32 n32s3 split; do
  t=/tmp/t_$v; [ $v = base ] && t=$R
  bench $v $t --mode fwd --head-dim 128 --seqlen 2048 --seqlen 4096 --seqlen 16384
done; done
for v in base pipe; do t=/tmp/t_$v; [ $v = base ] && t=$R
  bench $v $t --mode fwd --head-dim 64 --seqlen 4096 --seqlen 16384
  bench $v $t --mode bwd --head-dim 64 --head-dim 128 --seqlen 4096 --seqlen 16384
done
