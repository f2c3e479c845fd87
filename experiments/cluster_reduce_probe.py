"""Can this Triton reduce across the blocks of a thread-block cluster? Compiled for sm_90 on any machine.

A verify step whose V-chunks meet in distributed shared memory instead of global memory needs one program's
reduction to span a cluster's blocks (`num_ctas > 1`, the reduced axis split across them). This compiles the
smallest such kernel -- the max, its first index and a sum of exponentials over one 32768-wide row -- for an
sm_90 target with the installed Triton and reports whether it lowered and how many cluster instructions
(`mapa`, `barrier.cluster`, `shared::cluster`) its PTX holds. Nothing runs: no GPU is needed.

    python experiments/cluster_reduce_probe.py --out results/cluster_reduce_probe_triton39.json
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret (before triton is imported)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

CLUSTER_WORDS = ("mapa", "barrier.cluster", "shared::cluster")


def _lab_module(name: str):
    """`flashspec_lab.<name>` (a module of the standard library alone); loaded from its file when the lab is not
    installed (the probe needs only Triton, so it runs in a bare environment of any Triton version)."""
    try:
        return importlib.import_module(f"flashspec_lab.{name}")
    except ImportError:
        path = Path(__file__).resolve().parents[1] / "lab" / "flashspec_lab" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"_flashspec_lab_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


@triton.jit
def _row_reduce(x_ptr, out_ptr, V: tl.constexpr):
    """One row: its max, the first index of it, and the sum of exp(x - max)."""
    cols = tl.arange(0, V)
    x = tl.load(x_ptr + cols)
    top, index = tl.max(x, axis=0, return_indices=True)
    total = tl.sum(tl.exp(x - top), axis=0)
    tl.store(out_ptr, total)
    tl.store(out_ptr + 1, index.to(tl.float32))


def probe(num_ctas: int, vocab: int = 32768, num_warps: int = 4) -> dict:
    """Compile `_row_reduce` for sm_90 with `num_ctas` blocks per program; what happened."""
    source = ASTSource(_row_reduce, {"x_ptr": "*fp32", "out_ptr": "*fp32", "V": "constexpr"}, {"V": vocab})
    row = {"num_ctas": num_ctas, "vocab": vocab, "num_warps": num_warps}
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                options={"num_ctas": num_ctas, "num_warps": num_warps})
    except Exception as error:  # noqa: BLE001 -- the failure is the finding
        row.update(lowered=False, error=f"{type(error).__name__}: {error}"[:400])
        return row
    ptx = kernel.asm["ptx"]
    row.update(lowered=True, cluster_instructions={word: ptx.count(word) for word in CLUSTER_WORDS})
    row["cross_cta"] = num_ctas > 1 and sum(row["cluster_instructions"].values()) > 0
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--ctas", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args(argv)
    _lab_module("cli_checks").output_file(parser, "--out", args.out)
    rows = [probe(n) for n in args.ctas]
    provenance = _lab_module("provenance")
    provenance.write_result(args.out, provenance.record(),
                            {"target": "cuda sm_90, compiled only (nothing ran)", "ctas": args.ctas},
                            {"triton": triton.__version__, "probes": rows})
    for row in rows:
        state = (f"lowered, cluster instructions {row['cluster_instructions']}" if row["lowered"]
                 else f"failed: {row['error'][:120]}")
        print(f"triton {triton.__version__} num_ctas={row['num_ctas']}: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
