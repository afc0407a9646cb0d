# Call R (H100): the sm_90 hd128 forward on block_n 32 tiles (kv_stages 3 and 4) against the
# committed 128 x 64 tile, bf16 and fp16, seqlen 512-16k; and the hd64 backward on a 128 x 128
# tile (atomics), bf16.
set -uo pipefail
R=$PWD
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
[ -d /tmp/fgc/sm_90 ] || { mkdir -p /tmp/fgc; tar xzf scratch/fwd.tgz -C /tmp/fgc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
for v in n32s3 n32s4 b64m128; do rm -rf /tmp/t_$v; mkdir /tmp/t_$v; cp -r codegen flashgen templates /tmp/t_$v/; done
python3 - <<'PY'
for t, st in (("/tmp/t_n32s3", 3), ("/tmp/t_n32s4", 4)):
    p = t + "/codegen/configs/default.toml"; s = open(p).read()
    old = "[arch.sm_90.head_dim.128]\nblock_m = 128\nblock_n = 64\nwarps = 4\nkv_stages = 2"
    s = s.replace("[arch.sm_90.head_dim.128]\nblock_m = 128\nblock_n = 32\nwarps = 4\nkv_stages = 2", old)
    assert old in s; open(p, "w").write(s.replace(old, old.replace("block_n = 64", "block_n = 32").replace("kv_stages = 2", f"kv_stages = {st}")))
    print(t, "ok")
p = "/tmp/t_b64m128/codegen/configs/default.toml"; s = open(p).read()
old = "[arch.sm_90.head_dim.64.backward]\nblock_m = 64"
assert old in s; open(p, "w").write(s.replace(old, old.replace("block_m = 64", "block_m = 128"))); print("b64m128 ok")
PY
gen() { (cd $1 && PYTHONPATH=$1:/tmp/site python3 -m flashgen generate --arch sm_90 $2 --jobs 6 --out /tmp/gen_$(basename $1) > $OUT/gen_$(basename $1).log 2>&1); }
gen /tmp/t_n32s3 "--direction fwd --head-dim 128" &
gen /tmp/t_n32s4 "--direction fwd --head-dim 128" &
gen /tmp/t_b64m128 "--direction bwd --head-dim 64 --dtype bf16" &
gen $R "--direction bwd --head-dim 64 --dtype bf16" &
wait; grep -h "ready\|rror" $OUT/gen_*.log | head -20
for v in n32s3 n32s4; do (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout 90 python3 $R/scratch/fwd_smoke.py 128 2>&1 | tail -3 | sed "s/^/$v /" | tee -a $OUT/smoke.txt); done
(cd /tmp/t_b64m128 && PYTHONPATH=/tmp/t_b64m128:/tmp/site timeout 100 python3 $R/scratch/bwd_smoke.py 64 2>&1 | grep -E "FAIL|ratio" | sed 's/^/b64m128 /' | tee -a $OUT/smoke.txt)
bench() {  # $1 name, $2 tree, $3.. bench args
  local n=$1 t=$2; shift 2
  (cd $t && PYTHONPATH=$t:/tmp/site timeout 200 python3 -m flashgen bench --impl flashgen --impl FLASH_ATTENTION "$@" 2>&1 \
     | grep -E "x$" | sed "s|^|$n |" | sed 's/  */ /g' | tee -a $OUT/bench.txt)
}
ALL="--seqlen 512 --seqlen 1024 --seqlen 2048 --seqlen 4096 --seqlen 8192 --seqlen 16384"
for v in base n32s3 n32s4; do t=/tmp/t_$v; [ $v = base ] && t=$R
  bench $v $t --mode fwd --head-dim 128 $ALL
done
for v in base b64m128; do t=/tmp/t_$v; [ $v = base ] && t=$R
  bench $v $t --mode bwd --dtype bf16 --head-dim 64 --seqlen 4096 --seqlen 16384
done
for v in n32s4 n32s3 base; do t=/tmp/t_$v; [ $v = base ] && t=$R
  bench $v $t --mode fwd --head-dim 128 --seqlen 2048 --seqlen 4096 --seqlen 16384
done
