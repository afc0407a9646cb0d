# Calls C (H100): the tree with the mask-free step copy (hd32/64) and bulk dQ adds from 256-byte
# rows (hd64 and hd96 now too), one stage per call:
#   bash callC.sh check  # every sm_90 kernel built, the GPU suite (scripts/gpu_check.sh), then two
#                        # A/B sweeps, interleaved twice: hd96 with bulk adds (this tree) against
#                        # atomics (A96: DQ_BULK_ADD_MIN_ROW_BYTES back to 512), and hd64 with bulk
#                        # adds issued by 4 warps (this tree) against 2 warps (W2:
#                        # bwd_bulk_two_warps.patch)
#   bash callC.sh grid      # every sm_90 kernel built, scripts/bench_grid.sh
#   bash callC.sh sanitize  # scripts/sanitize.sh (on the warm machine, after grid)
# Forward kernels come from scratch/sm90-cache.tgz (compiled from the same forward sources).
set -uo pipefail
R=$PWD N=notes/runs/2026-11-23-session7
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
untar() { [ -d $1/sm_90 ] || { mkdir -p $1 && tar xzf scratch/sm90-cache.tgz -C $1; }; }
untar $FLASHGEN_CACHE_DIR
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
run_in() { local v=$1; shift; (cd /tmp/t_$v && FLASHGEN_CACHE_DIR=/tmp/fgc_$v PYTHONPATH=/tmp/t_$v:/tmp/site python3 "$@"); }
case $1 in
  check)
    for v in A96 W2; do
      rm -rf /tmp/t_$v && mkdir -p /tmp/t_$v && cp -r codegen flashgen templates /tmp/t_$v/ && untar /tmp/fgc_$v
    done
    sed -i 's/^DQ_BULK_ADD_MIN_ROW_BYTES = 256/DQ_BULK_ADD_MIN_ROW_BYTES = 512/' /tmp/t_A96/codegen/resources.py
    grep -q "^DQ_BULK_ADD_MIN_ROW_BYTES = 512" /tmp/t_A96/codegen/resources.py || exit 1
    (cd /tmp/t_W2 && patch -s -p1 < $R/$N/bwd_bulk_two_warps.patch) || exit 1
    { run_in A96 -m flashgen generate --arch sm_90 --head-dim 96 --dtype bf16 --jobs 2 2>&1 | tail -1
      run_in W2 -m flashgen generate --arch sm_90 --head-dim 64 --dtype bf16 --jobs 2 2>&1 | tail -1; } > $OUT/gen_variants.log &
    SKIP_BENCH=1 SKIP_SANITIZE=1 bash scripts/gpu_check.sh -m "not nvcc" -p no:cacheprovider
    wait
    export PYTHONPATH=$R:/tmp/site
    { python3 -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep built | sed "s|^|main |"
      for v in A96 W2; do run_in $v -m flashgen list --arch sm_90 --direction bwd 2>&1 | grep "bf16.*built" | sed "s|^|$v |"; done; } > $OUT/kernels.txt
    C96="96:2048:1 96:4096:0 96:4096:1 96:16384:0" C64="64:2048:0 64:4096:0 64:16384:0 64:2048:1 64:4096:1 64:16384:1"
    for rep in 1 2; do
      python3 $N/sweep_bwd.py bf16 $C96 $C64 2>&1 | sed "s/^/main /" | tee -a $OUT/sweep.txt | grep SUMMARY
      run_in A96 $R/$N/sweep_bwd.py bf16 $C96 2>&1 | sed "s/^/A96 /" | tee -a $OUT/sweep.txt | grep SUMMARY
      run_in W2 $R/$N/sweep_bwd.py bf16 $C64 2>&1 | sed "s/^/W2 /" | tee -a $OUT/sweep.txt | grep SUMMARY
    done ;;
  grid)
    export PYTHONPATH=$R:/tmp/site
    python3 -m flashgen generate --arch sm_90 --jobs 16 2>&1 | tail -1
    bash scripts/bench_grid.sh ;;
  sanitize)
    export PYTHONPATH=$R:/tmp/site
    bash scripts/sanitize.sh ;;
esac
