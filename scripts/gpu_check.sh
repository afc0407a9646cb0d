#!/usr/bin/env bash
# One call on a CUDA machine: build the default kernels (forward and backward) for its arch, run
# the GPU tests, benchmark.
#   bash scripts/gpu_check.sh [pytest args...]
# Logs go to $OUT (the device tool sets it) or ./gpu-logs. Wheels in .whl/ (nvidia-cutlass for a
# machine without network) are installed first; the checkout is used in place.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FLASHGEN_CACHE_DIR=${FLASHGEN_CACHE_DIR:-/tmp/flashgen-cache}
arch=$(python3 -c 'import torch; print("sm_%d%d" % torch.cuda.get_device_capability())')
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
  nvcc --version | tail -2; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee "$OUT/gpu.txt"

# The plain kernels of every head dim, the variants (window mask, score modifiers, dropout) at
# head dims 64 and 128, which their tests sweep, dropout's plain kernels at head dim 96, and the
# hopper family's bf16 variants at head dims 96 (dQ in uneven column shares), 192 and 256
# (their backward splits the head dim): the whole default config is about half again as many
# kernels.
for selection in "--mask none --mask causal --score-mod none --dropout without" \
    "--head-dim 64 --head-dim 128" "--head-dim 96 --score-mod none --dropout with" \
    "--head-dim 96 --head-dim 192 --head-dim 256 --dtype bf16 --family hopper --mask none" \
    "--head-dim 96 --head-dim 192 --head-dim 256 --dtype bf16 --family hopper --mask causal" \
    "--head-dim 96 --head-dim 192 --head-dim 256 --dtype bf16 --family hopper --mask window"; do
  # shellcheck disable=SC2086
  python3 -m flashgen generate --arch "$arch" $selection --jobs "$(nproc)" 2>&1 \
    | tee -a "$OUT/generate.log" | grep -v '^\[' ; [ "${PIPESTATUS[0]}" = 0 ] \
    || { echo "generate failed"; tail -50 "$OUT/generate.log"; exit 1; }
done
python3 -m pytest tests -q -rs "$@" 2>&1 | tee "$OUT/pytest.log" | tail -25
# The forward and backward suites again on the mma family (dispatch prefers the hopper family on
# an H100).
FLASHGEN_FAMILY=mma python3 -m pytest -q -rs "$@" tests/gpu/test_forward.py tests/gpu/test_odd_input.py \
  tests/gpu/test_numerics.py tests/gpu/test_wrong_input.py tests/gpu/test_hopper.py \
  tests/gpu/test_backward.py tests/gpu/test_training.py tests/gpu/test_compile.py \
  tests/gpu/test_hopper_backward.py 2>&1 | tee "$OUT/pytest-mma.log" | tail -5
# Every default head dim at seqlen 4096 (bf16), forward and backward, beside FlashAttention-2 and
# cuDNN in one process.
[ -n "${SKIP_BENCH:-}" ] || python3 -m flashgen bench --dtype bf16 --seqlen 4096 \
  --head-dim 32 --head-dim 64 --head-dim 96 --head-dim 128 --head-dim 192 --head-dim 256 \
  --impl flashgen --impl FLASH_ATTENTION --impl CUDNN_ATTENTION --mode fwd --mode bwd \
  --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
[ -n "${SKIP_SANITIZE:-}" ] || bash scripts/sanitize.sh
