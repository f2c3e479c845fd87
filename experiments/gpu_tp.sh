#!/usr/bin/env bash
# One device call on a two-GPU machine: the tensor-parallel benchmark at TP = 1 (one process, the unsharded
# target) and TP = 2 (torchrun, NCCL), graphs captured, then the same with compiled regions. Each phase has
# its own time limit and log under $OUT, so a phase that overruns or fails leaves the others' results.
#   FLASHSPEC_GIT_SHA=<sha> bash experiments/gpu_tp.sh
set -uo pipefail
: "${OUT:?set OUT}" "${FLASHSPEC_GIT_SHA:?set FLASHSPEC_GIT_SHA to the commit being measured}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pip install -q --no-deps --no-build-isolation -e . -e lab >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export PYTHONPATH="$PWD:$PWD/lab${PYTHONPATH:+:$PYTHONPATH}"  # bench_tp imports flashspec_lab
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; } >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
sha=$FLASHSPEC_GIT_SHA
phase() {  # name, seconds, ranks, bench options...
  local name=$1 limit=$2 ranks=$3; shift 3
  local start=$SECONDS
  timeout "$limit" torchrun --nproc-per-node "$ranks" -m flashspec bench tp --git-sha "$sha" \
    --out "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "phase $name rc=$rc $((SECONDS - start)) s" | tee -a "$OUT/phases.txt"
  grep -E "^TP=|Error|error" "$OUT/$name.log" | grep -v anatomy | tail -n 8
  return $rc
}
# ${TP_PHASES:-all}: which runs (graphs, compile, or all); REPEATS timed requests per method
repeats=${REPEATS:-3}
case ${TP_PHASES:-all} in graphs|all)
  phase bench_tp1_h200 170 1 --repeats "$repeats"
  # eager steps only if capturing the collectives failed (the JSON then has no cells)
  phase bench_tp2_h200x2 170 2 --repeats "$repeats" || grep -q '"batch"' "$OUT/bench_tp2_h200x2.json" 2>/dev/null \
    || phase bench_tp2_h200x2_eager 170 2 --repeats "$repeats" --graphs off ;;
esac
case ${TP_PHASES:-all} in compile|all)
  phase bench_tp1_h200_compile 200 1 --compile --repeats "$repeats"
  phase bench_tp2_h200x2_compile 200 2 --compile --repeats "$repeats" ;;
esac
