"""Instructions per loop of the verify kernels, compiled for SM90 on this machine (no GPU needed).

For each (B, V) point of `flashspec bench verify` and each plan named by `--variants` ("default": the shape's
`SHAPE_PLANS` entry under the installed Triton), binds the step's launches as an H200 would launch them, compiles
them with the installed Triton's ptxas and counts the machine code of every loop: instructions per iteration and
per vocabulary position a thread covers (a kernel whose programs cover one tile has no loop: its total is given;
a stats iteration reads the target's and the draft's logit at each
position; a race iteration reads one or both). Writes JSON. Run with TRITON_INTERPRET unset.

    python -m experiments.verify_sass --out results/verify_sass_sm90.json
"""
from __future__ import annotations

import argparse

from flashspec_lab import cli_checks, provenance
from flashspec_lab.bench import PLAN_VARIANTS
from flashspec_lab.kernels import sass
from flashspec.sampling import SamplingParams

POINTS = ((1, 32000), (8, 32000), (64, 32000), (1, 128256), (8, 128256), (64, 128256))


def count(batch: int, vocab: int, variant: str, gamma: int = 4) -> dict:
    """The loops of each launch of one point's plan."""
    tuning = None if variant == "default" else tuple(sorted(PLAN_VARIANTS[variant].items()))
    plan, launches = sass.bound_launches(batch, gamma, vocab, SamplingParams(1.0), tuning=tuning)
    rows = []
    for launch in launches:
        block_v = launch["constexprs"].get("BLOCK_V") or launch["constexprs"].get("STATS_BLOCK_V")
        per_thread = block_v // (32 * launch["num_warps"]) if block_v else None
        listing = sass.compile_sass(launch)
        found = sass.loops(listing)
        for loop in found:
            loop["per_position"] = loop["instructions"] / per_thread if per_thread else None
        rows.append({"kernel": launch["kernel"], "num_warps": launch["num_warps"], "block_v": block_v,
                     "positions_per_thread": per_thread, "loops": found,
                     "total_instructions": len(sass.instructions(listing)),
                     "constexprs": {k: v for k, v in launch["constexprs"].items() if not isinstance(v, str)}})
    return {"batch": batch, "vocab": vocab, "variant": variant, "launches": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", nargs="+", default=["default", "stats_lanes_off", "diagnostic_fast_math"])
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    unknown = [name for name in args.variants if name != "default" and name not in PLAN_VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; choose 'default' or from {sorted(PLAN_VARIANTS)}")
    points = [count(batch, vocab, variant) for batch, vocab in POINTS for variant in args.variants]
    provenance.write_result(args.out, provenance.record("python -m experiments.verify_sass", args.git_sha),
                            {"target": "sm_90 (compiled here, not run)", "gamma": 4, "temperature": 1.0,
                             "dtype": "bfloat16"}, points)
    for point in points:
        for launch in point["launches"]:
            loops = ", ".join(f"{loop['instructions']} ({loop['per_position']:.1f}/position)" for loop in launch["loops"])
            loops = loops or f"no loop: {launch['total_instructions']} instructions in all"
            print(f"B={point['batch']:3d} V={point['vocab']:6d} {point['variant']:16s} {launch['kernel']:22s} {loops}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
