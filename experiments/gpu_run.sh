#!/usr/bin/env bash
# One device call: install offline, then each named phase with its own time limit, its log and
# JSON under $OUT (so a phase that overruns still leaves the others' results).
#   FLASHSPEC_GIT_SHA=<sha> bash experiments/gpu_run.sh tests bench-b1 verify
# Phases: tests (GPU tests of kernels, runner, fast path), plain-arm (experiments/plain_arm_overhead.py: the
# plain arm inside the speculative decoder against fast plain, SmolLM2's shape; PLAIN_ARM_ARGS: more options),
# bench-b1 / bench-b8 / bench-b32
# (bench_fast --compile, random TinyLlama/68m shapes), bench-zoo (trained GPU zoo, B=1 and 8),
# verify (flashspec bench verify), host-profile (experiments/verify_host_profile.py at B = 1, 8 and V = 32000, 128256;
# PROFILE_TAG ends its file names, e.g. _triton39), interference (experiments/verify_interference.py: the eager step
# timed after different preceding calls), prefill (experiments/prefill_profile.py: where a request's prefill goes), profile-plain
# (experiments/profile_plain.py: the plain step kernel by kernel beside gpt-fast's; GPT_FAST: a carried checkout,
# default .peers/gpt-fast; PROFILE_ARGS: more options, e.g. --shapes llama-2-7b),
# peers (experiments/bench_peers.py beside gpt-fast at GPT_FAST and GPT_FAST_SPECULATIVE, default
# .peers/gpt-fast and .peers/gpt-fast-e2cfa34; PEERS_ARGS: more options, e.g. --shapes ... --timeout ...;
# PEERS_TAG: ends its log and JSON names, so one call can run it twice),
# bench-nf4 (bench_fast with the target in bitsandbytes NF4, B=1, 128 tokens;
# bitsandbytes must be importable), reproduce (flashspec reproduce t4 --source random: the paper's T4 table on this GPU with
# TinyLlama/68m-shaped random weights, NF4; bitsandbytes must be importable). TESTS: the test files of the tests phase. Time limits (s): TESTS_LIMIT, BENCH_LIMIT, PEERS_LIMIT, NF4_LIMIT, VERIFY_LIMIT, PREFILL_LIMIT; PREFILL_ARGS: more
# prefill_profile options (e.g. --compile default, as the real-pool runs); VERIFY_ARGS: more bench verify options (e.g.
# --variants ... --skip-sweep). TRITON_TARBALL: a .tar.xz of another Triton's package folder (carried: the device has
# no network), unpacked under $HOME and put first on PYTHONPATH, so every phase runs that Triton (e.g. 3.9, whose
# thread-block cluster reductions the device's own 3.6 cannot compile).
set -uo pipefail
: "${OUT:?set OUT}" "${FLASHSPEC_GIT_SHA:?set FLASHSPEC_GIT_SHA to the commit being measured}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
if [ -z "${FLASHSPEC_INSTALLED:-}" ]; then  # gpu_lanes.sh installs once for its lanes
  pip install -q --no-deps --no-build-isolation -e . -e lab >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
fi
# the checkout and its lab first on the path as well: the device's pip can serve another interpreter than `python`
export PYTHONPATH="$PWD:$PWD/lab${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${TRITON_TARBALL:-}" ]; then
  mkdir -p "$HOME/triton_alt" && tar xJf "$TRITON_TARBALL" -C "$HOME/triton_alt" || exit 1
  # a tarball trimmed to fit a carry: no AMD backend (drop its entry point) and one ptxas (Triton >= 3.9 asks for
  # ptxas-blackwell on SM90+; the legacy ptxas compiles SM90 too)
  sed -i '/amd/d' "$HOME"/triton_alt/triton-*.dist-info/entry_points.txt
  bin="$HOME/triton_alt/triton/backends/nvidia/bin"
  chmod +x "$bin"/*  # a tarball packed from an unzipped wheel can lose the tools' execute bits
  [ -e "$bin/ptxas-blackwell" ] || export TRITON_PTXAS_BLACKWELL_PATH="$bin/ptxas"
  export PYTHONPATH="$HOME/triton_alt${PYTHONPATH:+:$PYTHONPATH}"
  python -c "import triton; print('triton', triton.__version__, triton.__file__)" | tee "$OUT/triton.txt"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt"
sha=${FLASHSPEC_GIT_SHA:0:7}
phase() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "phase $name rc=$? $((SECONDS - start)) s" | tee -a "$OUT/phases.txt"
  tail -n 4 "$OUT/$name.log"
}
for name in "$@"; do
  case $name in
    tests) # shellcheck disable=SC2086  # TESTS is a list of files
           phase "gpu_tests_$sha" "${TESTS_LIMIT:-300}" python -m pytest -q -p no:cacheprovider \
             ${TESTS:-tests/test_kernels.py tests/test_runner.py tests/test_fast.py tests/test_nf4.py} ;;
    bench-b*) b=${name#bench-b}
             phase "bench_fast_b${b}_compile_h200" "${BENCH_LIMIT:-340}" python experiments/bench_fast.py --compile "${COMPILE_MODE:-default}" --batches "$b" \
               --out "$OUT/bench_fast_b${b}_compile_h200.json" ;;
    bench-zoo) phase bench_fast_zoo_gpu_compile_h200 540 python experiments/bench_fast.py --compile "${COMPILE_MODE:-default}" --pair zoo-gpu \
               --batches 1 8 --new-tokens 128 --out "$OUT/bench_fast_zoo_gpu_compile_h200.json" ;;
    bench-nf4) phase bench_fast_nf4_h200 "${NF4_LIMIT:-240}" python experiments/bench_fast.py --quantization nf4 --compile "${COMPILE_MODE:-default}" \
               --batches 1 --new-tokens 128 --out "$OUT/bench_fast_nf4_h200.json" ;;
    verify) phase "verify_h200_$sha" "${VERIFY_LIMIT:-300}" python -m flashspec.cli bench verify --out "$OUT/verify_h200.json" ${VERIFY_ARGS:-} ;;
    host-profile) for vocab in 32000 128256; do for b in 1 8; do  # where the eager verify step's host time goes
               phase "verify_host_profile_b${b}_v${vocab}_$sha" 120 python -m experiments.verify_host_profile \
                 --batch "$b" --vocab "$vocab" --git-sha "$FLASHSPEC_GIT_SHA" \
                 --out "$OUT/verify_host_profile_b${b}_v${vocab}_h200${PROFILE_TAG:-}.json"; done; done ;;
    interference) phase "verify_interference_$sha" 200 python -m experiments.verify_interference \
               --vocab 32000 128256 --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/verify_interference_h200.json" ;;
    ncu) ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
         [ -n "$ncu_bin" ] || { echo "phase ncu: no ncu on this machine" | tee -a "$OUT/phases.txt"; continue; }
         "$ncu_bin" --version | tail -n 1 >"$OUT/ncu_version.txt"
         # shellcheck disable=SC2046,SC2086  # ncu-args and NCU_ARGS are option lists
         phase "verify_ncu_$sha" "${NCU_LIMIT:-420}" "$ncu_bin" --log-file "$OUT/verify_ncu_raw.csv" \
           $(python -m experiments.verify_ncu ncu-args) python -m experiments.verify_ncu run \
           --manifest "$OUT/verify_ncu_manifest.json" ${NCU_ARGS:-}
         phase "verify_ncu_parse_$sha" 60 python -m experiments.verify_ncu parse --csv "$OUT/verify_ncu_raw.csv" \
           --manifest "$OUT/verify_ncu_manifest.json" --git-sha "$FLASHSPEC_GIT_SHA" \
           --ncu-command "$(cat "$OUT/ncu_version.txt"): ncu $(python -m experiments.verify_ncu ncu-args) python -m experiments.verify_ncu run ${NCU_ARGS:-}" \
           --out "$OUT/verify_ncu_h200.json" ;;
    reproduce) phase "reproduce_t4_$sha" "${REPRODUCE_LIMIT:-300}" python -m experiments.reproduce_t4 --source random \
               --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/reproduce_t4_h200_random.json" ;;
    profile-plain) # shellcheck disable=SC2086  # PROFILE_ARGS is a list of options
                   phase "profile_plain_$sha" "${PROFILE_LIMIT:-540}" python experiments/profile_plain.py \
               --gpt-fast "${GPT_FAST:-.peers/gpt-fast}" --timeout "$(( ${PROFILE_LIMIT:-540} - 20 ))" \
               --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/profile_plain_h200.json" ${PROFILE_ARGS:-} ;;
    peers) # shellcheck disable=SC2086  # PEERS_ARGS is a list of options
           phase "peers${PEERS_TAG:-}_$sha" "${PEERS_LIMIT:-540}" python experiments/bench_peers.py \
             --gpt-fast "${GPT_FAST:-.peers/gpt-fast}" --gpt-fast-speculative "${GPT_FAST_SPECULATIVE:-.peers/gpt-fast-e2cfa34}" \
             --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/peers${PEERS_TAG:-}.json" ${PEERS_ARGS:-} ;;
    plain-arm) phase "plain_arm_overhead_$sha" "${PLAIN_ARM_LIMIT:-300}" python experiments/plain_arm_overhead.py \
                 --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/plain_arm_overhead.json" ${PLAIN_ARM_ARGS:-} ;;
    prefill) phase "prefill_profile_h200_$sha" "${PREFILL_LIMIT:-150}" python -m experiments.prefill_profile \
               --git-sha "$FLASHSPEC_GIT_SHA" --out "$OUT/prefill_profile_h200.json" ${PREFILL_ARGS:-} ;;
    *) echo "unknown phase $name" >&2; exit 2 ;;
  esac
done
