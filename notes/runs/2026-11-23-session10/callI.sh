# Call I (H100): the final tree's backward GPU tests (every sm_90 kernel built afresh):
#   bash notes/runs/2026-11-23-session10/callI.sh
set -uo pipefail
export FLASHGEN_CACHE_DIR=/tmp/flashgen-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
python3 -m flashgen generate --arch sm_90 --jobs 16 2>&1 | tail -1
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grid_order.py tests/gpu/test_backward.py \
  tests/gpu/test_training.py 2>&1 | tee $OUT/pytest.log | tail -3
