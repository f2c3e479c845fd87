#!/usr/bin/env bash
# Build a Triton package folder small enough for one device carry (64 MiB) as a .tar.xz, for
# experiments/gpu_run.sh's TRITON_TARBALL: the device machine has no network and its own Triton is older.
#   bash tools/triton_tarball.sh 3.9.0 3.12 .carry/t/triton39_cp312.tar.xz
# Downloads the manylinux x86_64 wheel for that Python, drops what an NVIDIA SM90 run never loads (the AMD
# backend, the profiler, CUPTI, the instrumentation library, nvdisasm, the second ptxas), strips the debug
# symbols of libtriton, and compresses (xz -9: about 50 MB for 3.9.0, a few minutes on two cores).
set -euo pipefail
version=$1 python=$2 out=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download -q --no-deps "triton==$version" --python-version "$python" --only-binary=:all: \
  --platform manylinux_2_28_x86_64 -d "$work/wheel"
mkdir "$work/pkg"
(cd "$work/pkg" && unzip -q "$work"/wheel/*.whl)
rm -rf "$work"/pkg/triton/backends/amd "$work"/pkg/triton/backends/nvidia/lib/cupti* \
  "$work"/pkg/triton/backends/nvidia/bin/ptxas-blackwell "$work"/pkg/triton/backends/nvidia/bin/nvdisasm \
  "$work"/pkg/triton/_C/libproton.so "$work"/pkg/triton/instrumentation
strip --strip-unneeded "$work"/pkg/triton/_C/libtriton.so
mkdir -p "$(dirname "$out")"
(cd "$work/pkg" && tar cf - . | xz -9 -T0 > "$OLDPWD/$out")
ls -l "$out"
