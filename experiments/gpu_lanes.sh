#!/usr/bin/env bash
# One device call on a two-GPU machine running two single-GPU lanes side by side: each argument is a list
# of gpu_run.sh phases for one GPU. Installs once (the carried .whl/ wheels too, e.g. bitsandbytes), then
# packs every lane's logs and JSON into $OUT/lanes.tgz (a call brings back only a few files).
#   FLASHSPEC_GIT_SHA=<sha> bash experiments/gpu_lanes.sh "verify bench-b32" "tests bench-nf4"
# The lanes share the host's CPUs: timings of one lane can feel the other's host load.
set -uo pipefail
: "${OUT:?set OUT}" "${FLASHSPEC_GIT_SHA:?set FLASHSPEC_GIT_SHA to the commit being measured}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
pip install -q --no-deps --no-build-isolation -e . -e lab >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export FLASHSPEC_INSTALLED=1
lane=0
for phases in "$@"; do
  mkdir -p "$OUT/gpu$lane"
  # shellcheck disable=SC2086  # the phases are words
  (CUDA_VISIBLE_DEVICES=$lane OUT=$OUT/gpu$lane bash experiments/gpu_run.sh $phases >"$OUT/gpu$lane/lane.log" 2>&1) &
  lane=$((lane + 1))
done
wait
cat "$OUT"/gpu*/phases.txt
tar -czf "$OUT/lanes.tgz" -C "$OUT" $(cd "$OUT" && ls -d gpu*) install.log && rm -rf "$OUT"/gpu*
