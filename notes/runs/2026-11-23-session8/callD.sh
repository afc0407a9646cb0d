# Calls D and E (H100) on the committed tree (d68c3d7: call B's WED kernels + the lighter host
# path), one stage per call:
#   bash callD.sh check     # every sm_90 kernel built, the GPU suite (scripts/gpu_check.sh), the
#                           # host path again (host_path.py), bench --overhead, a short sweep
#   bash callD.sh grid      # scripts/bench_grid.sh (on the warm machine)
#   bash callD.sh sanitize  # scripts/sanitize.sh
# Forward kernels come from scratch/sm90-cache.tgz (compiled from the same forward sources).
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session8 S7=notes/runs/2026-11-23-session7
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
[ -d $FLASHGEN_CACHE_DIR/sm_90 ] || { mkdir -p $FLASHGEN_CACHE_DIR && tar xzf scratch/sm90-cache.tgz -C $FLASHGEN_CACHE_DIR; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site
case $1 in
  check)
    SKIP_BENCH=1 SKIP_SANITIZE=1 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider
    python3 -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep built > $OUT/kernels.txt
    python3 $N/host_path.py bf16 64:2048:0 128:2048:1 2>&1 | grep -v -i warn | head -8 | tee $OUT/host_path.txt
    python3 -m flashgen bench --overhead 2>&1 | tee $OUT/overhead.txt
    python3 $S7/sweep_bwd.py bf16 64:2048:0 64:4096:0 64:2048:1 64:4096:1 128:2048:1 128:4096:1 2>&1 | tee $OUT/sweep.txt | grep SUMMARY ;;
  grid)
    bash scripts/bench_grid.sh ;;
  sanitize)
    bash scripts/sanitize.sh ;;
esac
