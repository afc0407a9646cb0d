# Call A (H100): every sm_90 kernel built from this tree (split key blocks), the grid-order and
# backward GPU tests, the split sweep (bf16 and fp16, non-causal cells and two causal controls),
# and the kernel cache back in pieces (scratch/ for the next calls):
#   bash notes/runs/2026-11-23-session10/callA.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session10
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
if compgen -G "scratch/s9-cache.tgz.*" >/dev/null; then
  mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
fi
start=$(date +%s)
python3 -m flashgen generate --arch sm_90 --jobs 16 > $OUT/generate.log 2>&1 || { tail -30 $OUT/generate.log; exit 1; }
echo "generate: $(( $(date +%s) - start )) s"
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grid_order.py tests/gpu/test_backward.py 2>&1 | tee $OUT/pytest.log | tail -4
for dtype in bf16 fp16; do
  python3 $N/sweep_bwd_split.py $dtype 64:2048:0 64:4096:0 64:8192:0 64:16384:0 128:2048:0 \
    128:4096:0 128:8192:0 128:16384:0 256:4096:0 256:16384:0 64:16384:1 128:16384:1 2>&1 | grep -v -i warn
done | tee $OUT/sweep.txt
rm -rf $FLASHGEN_CACHE_DIR/*.lock 2>/dev/null
(cd $FLASHGEN_CACHE_DIR && tar czf - .) | split -b 15M - $OUT/s10-cache.tgz.
ls -la $OUT
