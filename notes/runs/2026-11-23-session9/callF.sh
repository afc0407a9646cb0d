# Call F (H100): the sorted tail against (batch, head)-major grids where a (batch, head) has many
# key blocks (causal 8k-16k; hd256 4k-16k), twice per dtype (sweep_bwd_order.py, kernels from
# call A's cache):  bash notes/runs/2026-11-23-session9/callF.sh
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session9
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
mkdir -p $FLASHGEN_CACHE_DIR && cat scratch/s9-cache.tgz.* | tar xz -C $FLASHGEN_CACHE_DIR
for round in 1 2; do
  for dtype in bf16 fp16; do
    python3 $N/sweep_bwd_order.py $dtype 64:8192:1 64:16384:1 128:8192:1 128:16384:1 256:4096:1 \
      256:8192:1 256:16384:1 2>&1 | grep -v -i warn
  done
done | tee $OUT/sweep.txt
