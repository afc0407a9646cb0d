#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over flashgen's forward and
# backward kernels at odd sizes (the forward on the family dispatch picks: hopper on an H100),
# then memcheck and racecheck over the inference kernels (scripts/sanitize_inference.py).
# Run after scripts/gpu_check.sh has built the kernels (same environment variables); arguments go
# to scripts/sanitize_driver.py (--forward-only).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
status=0
for tool in memcheck racecheck synccheck initcheck; do
  # initcheck must watch every kernel: writes by unwatched kernels (torch.randn) look missing.
  filter=(--kernel-name kns=flashgen)  # every kernel of namespace flashgen, none of torch's
  family=()
  if [ "$tool" = initcheck ]; then
    filter=()
    # initcheck (CUDA 13.0, H100) reported every hopper forward output, which only TMA stores
    # write, as uninitialized when copied out, although each matched the reference: it does not
    # see those stores. It checks the mma family's kernels.
    family=(env FLASHGEN_FAMILY=mma)
  fi
  timeout 150 "${family[@]}" compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 3 \
    python3 scripts/sanitize_driver.py "$@" > "$OUT/sanitize-$tool.log" 2>&1
  rc=$?
  echo "$tool (exit $rc): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checked calls' "$OUT/sanitize-$tool.log" | tr '\n' ' ')"
  [ $rc = 0 ] || { status=1; grep -m 20 -E '=====' "$OUT/sanitize-$tool.log"; }
done
# The inference kernels (decode, append, combine; the varlen forward and backward).
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool "$tool" --kernel-name kns=flashgen --error-exitcode 3 \
    python3 scripts/sanitize_inference.py > "$OUT/sanitize-inference-$tool.log" 2>&1
  rc=$?
  echo "inference $tool (exit $rc): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checked calls' "$OUT/sanitize-inference-$tool.log" | tr '\n' ' ')"
  [ $rc = 0 ] || { status=1; grep -m 20 -E '=====' "$OUT/sanitize-inference-$tool.log"; }
done
exit $status
