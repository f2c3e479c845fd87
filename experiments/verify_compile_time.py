"""Seconds to compile each verify launch of the fast path for SM90 with the installed Triton, and its machine code.

The fast path's first speculative request builds the verify kernels at their first launch (Triton's JIT, then
ptxas). This times that build on this machine, no GPU needed: for each (B, V) and verify method, the launches an
SM90 GPU would make for the fast path's step (float32 logits, the draft's warped log-probs, the key in device
memory; `flashspec_lab.kernels.sass.bound_launches`), each compiled from a cold cache, with its SASS instruction
count. Run it under another Triton by putting that Triton's package first on PYTHONPATH. TRITON_INTERPRET unset.

    python -m experiments.verify_compile_time --out results/verify_compile_time_sm90_triton39.json
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec.sampling import SamplingParams  # noqa: E402
from flashspec_lab import cli_checks, provenance  # noqa: E402
from flashspec_lab.kernels import sass  # noqa: E402

POINTS = ((1, 32000), (1, 49152), (8, 32000), (64, 32000), (1, 128256), (8, 128256))
METHODS = ("token", "block")


def time_point(batch: int, vocab: int, method: str, gamma: int) -> dict:
    """Every launch of one fast-path verify step: kernel, compile seconds from a cold cache, SASS instructions."""
    from flashspec.kernels import block_pass

    sampler = block_pass.SAMPLER if method == "block" else "race"
    plan, launches = sass.bound_launches(batch, gamma, vocab, SamplingParams(1.0), device_key=True, sampler=sampler,
                                         dtype=torch.float32, draft_is_log_probs=True)
    rows = []
    for launch in launches:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TRITON_CACHE_DIR"] = cache  # cold: nothing of an earlier launch is reused
            start = time.perf_counter()
            listing = sass.compile_sass(launch)
            seconds = time.perf_counter() - start
        rows.append({"kernel": launch["kernel"], "compile_s": seconds,
                     "sass_instructions": len(sass.instructions(listing)), "num_warps": launch["num_warps"],
                     "constexprs": {k: v for k, v in launch["constexprs"].items() if not isinstance(v, str)}})
        print(f"B={batch} V={vocab} {method} {launch['kernel']}: {seconds:.1f} s, "
              f"{rows[-1]['sass_instructions']} instructions", flush=True)
    return {"batch": batch, "vocab": vocab, "method": method, "structure": plan.structure, "launches": rows,
            "compile_s": sum(row["compile_s"] for row in rows)}


def main(argv: list[str] | None = None) -> int:
    import triton

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write (rewritten after every point)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.gamma < 1:
        parser.error(f"--gamma must be >= 1, got {args.gamma}")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("unset TRITON_INTERPRET: interpreted, the kernels are plain Python and nothing compiles")
    record = provenance.record("python -m experiments.verify_compile_time", args.git_sha)
    settings = {"target": "sm_90 (compiled here, not run)", "triton": triton.__version__, "gamma": args.gamma,
                "temperature": 1.0, "logits": "float32, the draft's warped log-probs, key in device memory",
                "compile_threads": 1}
    points = []
    for batch, vocab in POINTS:
        for method in args.methods:
            points.append(time_point(batch, vocab, method, args.gamma))
            provenance.write_result(args.out, record, settings, points)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
