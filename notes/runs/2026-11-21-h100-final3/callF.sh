# Host-overhead discrepancy: the bench's measure and scripts/host_overhead.py in one process.
set -uo pipefail
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
python3 - <<'PY'
import torch
from flashgen import bench
for label, ctx in (("grad on", torch.enable_grad), ("no_grad", torch.no_grad)):
    with ctx():
        for calls in (2000, 500):
            print(label, calls, {k: round(v, 2) for k, v in bench.overhead_us(calls=calls).items()})
PY
python3 scripts/host_overhead.py 2>&1 | head -12
python3 - <<'PY'
import torch
from flashgen import bench
with torch.no_grad():
    print("after script, no_grad 500", {k: round(v, 2) for k, v in bench.overhead_us(calls=500).items()})
PY
