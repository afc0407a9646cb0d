# Call C: the tuner (backward hd 64/128/256, forward hd 64/256, bf16) on prebuilt candidates, and
# the backward address-arithmetic variant against the committed backward.
set -uo pipefail
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 FLASHGEN_CACHE_DIR=/tmp/fgc
if [ ! -d /tmp/fgc/sm_90 ]; then mkdir -p /tmp/fgc; for t in scratch/fwd.tgz scratch/bwd.tgz; do tar xzf $t -C /tmp/fgc; done; fi
[ -f /tmp/tuned.toml ] || cp codegen/configs/default.toml /tmp/tuned.toml
if [ "$1" = bwd ]; then
t0=$(date +%s)
PYTHONPATH=$R:/tmp/site timeout 400 python3 -m flashgen tune --arch sm_90 --config /tmp/tuned.toml --dtype bf16 \
  --direction bwd --head-dim 64 --head-dim 128 --head-dim 256 --write --out $OUT/tune_bwd.json > $OUT/tune_bwd.log 2>&1
echo "tune bwd rc $? $(( $(date +%s) - t0 ))s"; grep -E "ratio|flashgen tune|skipped" $OUT/tune_bwd.log | sed 's/  */ /g' | cut -c1-120
cp /tmp/tuned.toml $OUT/tuned.toml
exit 0
fi
t0=$(date +%s)
PYTHONPATH=$R:/tmp/site timeout 200 python3 -m flashgen tune --arch sm_90 --config /tmp/tuned.toml --dtype bf16 \
  --direction fwd --head-dim 64 --head-dim 256 --write --out $OUT/tune_fwd.json > $OUT/tune_fwd.log 2>&1
echo "tune fwd rc $? $(( $(date +%s) - t0 ))s"; grep -E "ratio|flashgen tune|skipped" $OUT/tune_fwd.log | sed 's/  */ /g' | cut -c1-120
cp /tmp/tuned.toml $OUT/tuned.toml
# Backward variant: the committed tree with the patch, hd 64/128 bf16, against the committed kernel.
rm -rf /tmp/tv && mkdir /tmp/tv && cp -r codegen flashgen templates pyproject.toml /tmp/tv/ && (cd /tmp/tv && patch -s -p1 < $R/scratch/variants/bwd_addr.patch)
for tree in $R /tmp/tv; do
  (cd $tree && PYTHONPATH=$tree:/tmp/site timeout 150 python3 -m flashgen generate --arch sm_90 --dtype bf16 --direction bwd \
     --head-dim 64 --head-dim 128 --jobs 16 --out /tmp/gen_$(basename $tree) 2>&1 | tail -1
   PYTHONPATH=$tree:/tmp/site timeout 120 python3 -m flashgen bench --dtype bf16 --seqlen 4096 --head-dim 64 --head-dim 128 \
     --impl flashgen --impl FLASH_ATTENTION --mode bwd 2>&1 | grep -E "x$" | sed "s|^|$(basename $tree) |")
done
