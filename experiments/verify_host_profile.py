"""Where the host time of one eager verify step goes: `verify_triton` (what `flashspec.verify` and the engines
call: a warm step launched straight from its binding) called in a loop without synchronising (so the host, not
the GPU, sets the pace), under cProfile. Writes the wall time per call, the same step made in two parts
(`prepare_verify`, then `PreparedVerify.run`: the host work before the launches and the launches) and the
functions with the most own time as JSON.

    python experiments/verify_host_profile.py --out results/verify_host_profile_h200.json
"""
from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from flashspec import rng
from flashspec_lab import cli_checks, provenance
from flashspec_lab.bench import _wall_us
from flashspec_lab.bench import make_inputs
from flashspec.kernels import prepare_verify, verify_triton
from flashspec.sampling import SamplingParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: the host path measured here is the compiled kernels' launch path")
    params = SamplingParams(1.0)
    target, draft, tokens = make_inputs(args.batch, 4, args.vocab, torch.bfloat16, params, seed=1, device="cuda")
    key = rng.Key.from_seed(12345)

    def step():
        return verify_triton(target, draft, tokens, params, key)

    def prepare():
        return prepare_verify(target, draft, tokens, params, key)

    prepared = prepare()
    for _ in range(50):
        step()
        prepared.run()
    torch.cuda.synchronize()
    wall_us = _wall_us(step, args.calls)
    split = {"step": "verify_triton",
             "prepare_us_per_call": _wall_us(prepare, args.calls),  # the host work before the launches
             "run_us_per_call": _wall_us(prepared.run, args.calls),  # the launches of one prepared step
             "launches_per_step": prepared.plan.launches}
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, name), (calls, _, own, cumulative, _) in stats.stats.items():
        rows.append({"function": f"{filename.rsplit('/', 2)[-1]}:{line}:{name}", "calls_per_step": calls / args.calls,
                     "own_us_per_step": own / args.calls * 1e6, "cumulative_us_per_step": cumulative / args.calls * 1e6})
    rows.sort(key=lambda row: -row["own_us_per_step"])
    provenance.write_result(args.out, provenance.record("python experiments/verify_host_profile.py", args.git_sha),
                            vars(args) | {"gamma": 4, "dtype": "bfloat16", "temperature": 1.0},
                            {"wall_us_per_call_unprofiled": wall_us, **split, "top_own_time": rows[:40]})
    print(f"wall {wall_us:.1f} us per verify_triton call (unprofiled); in two parts: prepare "
          f"{split['prepare_us_per_call']:.1f}, run {split['run_us_per_call']:.1f} ({split['launches_per_step']} launches)")
    for row in rows[:25]:
        print(f"{row['own_us_per_step']:8.2f} us own {row['cumulative_us_per_step']:8.2f} cum "
              f"{row['calls_per_step']:5.1f}x  {row['function']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
