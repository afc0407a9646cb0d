# Call E (H100): the hd64 backward tile now that its dQ leaves by bulk adds: 128 x 128 (committed;
# it beat 64 x 128 by 5% with atomics in session 5) against 64 x 128 (T64: 64 staged rows, two
# issuing warps, 32 scores per thread so no mask-free copy). bf16, interleaved twice.
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session7
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
for v in main T64; do
  rm -rf /tmp/t_$v /tmp/fgc_$v && mkdir -p /tmp/t_$v /tmp/fgc_$v && cp -r codegen flashgen templates /tmp/t_$v/
  tar xzf scratch/sm90-cache.tgz -C /tmp/fgc_$v
done
python3 - <<'PY' || exit 1
import re
p = "/tmp/t_T64/codegen/configs/default.toml"
s = open(p).read()
old = "[arch.sm_90.head_dim.64.backward]\nblock_m = 128\n"
assert old in s
open(p, "w").write(s.replace(old, "[arch.sm_90.head_dim.64.backward]\nblock_m = 64\n"))
PY
run_in() { local v=$1; shift; (cd /tmp/t_$v && FLASHGEN_CACHE_DIR=/tmp/fgc_$v PYTHONPATH=/tmp/t_$v:/tmp/site python3 "$@"); }
for v in main T64; do
  (run_in $v -m flashgen generate --arch sm_90 --head-dim 64 --dtype bf16 --direction bwd \
     --jobs 8 > /tmp/gen_$v.log 2>&1; echo "$v generate rc $? $(tail -1 /tmp/gen_$v.log)") &
done; wait
for v in main T64; do
  run_in $v -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16_hd64.*built" | sed "s|^|$v |"
done | tee $OUT/kernels.txt
run_in T64 $R/notes/runs/2026-11-23-session6/smoke_order.py 64 2 bf16 bwd 2>&1 | sed "s|^|T64 |" | tee $OUT/smoke.txt | grep -E "FAIL|SMOKE"
CELLS="64:2048:0 64:4096:0 64:16384:0 64:2048:1 64:4096:1 64:16384:1"
for rep in 1 2; do for v in main T64; do
  run_in $v $R/$N/sweep_bwd.py bf16 $CELLS 2>&1 | sed "s/^/$v /" | tee -a $OUT/sweep.txt | grep SUMMARY
done; done
