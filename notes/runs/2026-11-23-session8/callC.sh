# Call C (H100): where the backward's host time goes (host_path.py) on the committed tree
# (5da7d4a), hd64 full 2k and hd128 causal 2k, bf16.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site FLASHGEN_CACHE_DIR=/tmp/fgc
mkdir -p /tmp/fgc; [ -d /tmp/fgc/sm_90 ] || tar xzf scratch/sm90-cache.tgz -C /tmp/fgc
python3 -m flashgen generate --arch sm_90 --head-dim 64 --head-dim 128 --dtype bf16 --direction bwd --jobs 4 --out /tmp/gen 2>&1 | tail -1
python3 notes/runs/2026-11-23-session8/host_path.py bf16 64:2048:0 128:2048:1 2>&1 | grep -v -i warn | tee $OUT/host_path.txt
