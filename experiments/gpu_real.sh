#!/usr/bin/env bash
# SmolLM2 and its distilled pool on a device machine that cannot take the 93 MB GGUF in one call's carry
# (64 MiB): two calls back to back on one warm machine (files under $HOME outlive a call there), each
# carrying one half of the file (`split -n 2 -d`) plus the gguf wheel in a folder that git ignores.
#   call 1: FLASHSPEC_GIT_SHA=<sha> bash experiments/gpu_real.sh first .carry/a
#           keeps its half, then checks the GPU path on SmolLM2's shapes with random weights (no wheel needed)
#   call 2: FLASHSPEC_GIT_SHA=<sha> bash experiments/gpu_real.sh second .carry/b
#           joins the halves, checks the SHA-256, converts once, runs experiments/real_pool.py
# Env: TRAIN_BUDGET_S (fit the distillation steps to this many seconds; default: the size's own steps),
# POOL_ARGS (more real_pool.py options), POOL_LIMIT (seconds per run, default 500), POOL_RUNS (runs of
# real_pool.py, default 1; each after the first loads the pool from the cache and writes *_runN.json), SHAPE_SMOKE=0 (the first call
# runs the GPU tests only, not the random-weight pool on SmolLM2's shapes: a shorter first call), PROBE_ARGS
# (options of experiments/feature_draft_probe.py: the second call runs it after the pool runs, e.g. with POOL_RUNS=0),
# TESTS (the first call's pytest arguments, default the three real-model test files), TEST_LIMIT (their seconds,
# default 300: compiling the feature draft's regions on the GPU takes a while). The second call spends about 40 s
# before real_pool.py starts: POOL_LIMIT must leave that much of the call's limit, or the call is cut first.
set -uo pipefail
: "${OUT:?set OUT}" "${FLASHSPEC_GIT_SHA:?set FLASHSPEC_GIT_SHA to the commit being measured}"
stage=$1 carried=$2
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg FLASHSPEC_CACHE=$HOME/flashspec-cache
mkdir -p "$HOME/smollm2"
cp "$carried"/smol.part* "$HOME/smollm2/"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$carried"/*.whl \
  || exit 1
pip install -q --no-deps --no-build-isolation -e . -e lab >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
# the checkout and its lab first on the path (the drivers and tests import flashspec_lab; the device's pip can
# serve another interpreter than `python`), then the carried wheel
export PYTHONPATH="$PWD:$PWD/lab:/tmp/site"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt"
sha=${FLASHSPEC_GIT_SHA:0:7}
if [ "$stage" = first ]; then
  # shellcheck disable=SC2086  # TESTS is a list of pytest arguments
  timeout "${TEST_LIMIT:-300}" python -m pytest -q -p no:cacheprovider \
    ${TESTS:-tests/test_real.py tests/test_distill.py tests/test_features.py} >"$OUT/real_tests_$sha.log" 2>&1
  echo "tests rc=$?"; tail -n 3 "$OUT/real_tests_$sha.log"
  [ "${SHAPE_SMOKE:-1}" = 0 ] && exit 0
  timeout 300 python experiments/real_pool.py --size smollm2 --teacher smollm2-shape --train-budget-s 15 \
    --requests 3 --block 1 --new-tokens 32 --repeats 1 --eval-tokens 4096 --git-sha "$FLASHSPEC_GIT_SHA" \
    --out "$OUT/real_pool_shape_h200.json" >"$OUT/real_pool_shape.log" 2>&1
  echo "shape smoke rc=$?"; grep -E "real_pool|Error|error" "$OUT/real_pool_shape.log" | tail -n 20
  exit 0
fi
gguf=$HOME/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat "$HOME"/smollm2/smol.part00 "$HOME"/smollm2/smol.part01 >"$gguf" || exit 1
python - "$gguf" <<'EOF' || exit 1
import sys
from flashspec import real
real.load_gguf_model(real.SMOLLM2, device="cpu", gguf_path=sys.argv[1])  # checks the SHA-256, converts, caches
print("SmolLM2 converted and cached")
EOF
for run in $(seq 1 "${POOL_RUNS:-1}"); do  # later runs load the pool from the cache: more samples of the parts
  suffix=$([ "$run" = 1 ] || echo "_run$run")
  # shellcheck disable=SC2086  # POOL_ARGS is a list of options
  timeout "${POOL_LIMIT:-500}" python experiments/real_pool.py ${TRAIN_BUDGET_S:+--train-budget-s "$TRAIN_BUDGET_S"} \
    --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/real_pool_h200$suffix.json" ${POOL_ARGS:-} 2>&1 \
    | grep --line-buffered -v "Loading weights\|Writing model" >"$OUT/real_pool$suffix.log"
  echo "real_pool$suffix rc=${PIPESTATUS[0]}"; tail -n 25 "$OUT/real_pool$suffix.log"
done
if [ -n "${PROBE_ARGS:-}" ]; then
  # shellcheck disable=SC2086  # PROBE_ARGS is a list of options
  timeout "${POOL_LIMIT:-500}" python experiments/feature_draft_probe.py --git-sha "$FLASHSPEC_GIT_SHA" \
    --out "$OUT/feature_draft_probe_h200.json" ${PROBE_ARGS} 2>&1 \
    | grep --line-buffered -v "Loading weights" >"$OUT/feature_draft_probe.log"
  echo "feature_draft_probe rc=${PIPESTATUS[0]}"; tail -n 12 "$OUT/feature_draft_probe.log"
fi
