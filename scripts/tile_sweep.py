"""A hand-picked forward tile sweep on sm_90 bf16 (a subset of flashgen.tools.tune's grid, small
enough to compile on a 2-core machine and carry): python3 scripts/tile_sweep.py [--build-only]."""

import json
import os
import sys

from codegen.families.mma import FwdTile
from codegen.spec import KernelSpec
from flashgen.tools.tune import parse_tile

CANDIDATES = {
    64: ["m128n64w4s3", "m128n64w4s2", "m128n128w4s2", "m128n128w8s2", "m64n64w4s2"],
    128: ["m128n64w4s2", "m128n64w4s3", "m128n32w4s2", "m128n128w8s2", "m128n64w8s2",
          "m64n64w4s2", "m64n128w4s2"],
    256: ["m128n64w8s2", "m64n64w4s2", "m128n32w8s2", "m64n64w4s3", "m64n32w4s2"],
}


specs = [KernelSpec("mma", "fwd", "sm_90", "bf16", hd, mask, parse_tile(t, FwdTile))
         for hd, tiles in CANDIDATES.items() for t in tiles for mask in ("none", "causal")]

if "--build-only" in sys.argv:
    from codegen import build

    build.build(specs)
else:
    from flashgen.tools import tune

    rows = tune.sweep(specs)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "tile_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
